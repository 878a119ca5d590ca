"""The API: the TFDataService resource as the operator reads it.

Its spec parsed, defaulted and validated (``spec``, a package with a module per section), the
Kubernetes core types it embeds (``coretypes``), its identity and reasons (``identity``,
``reasons``), a ``TFDataSnapshot``'s spec (``snapshot``), and the small rules they share
(``quantity``, ``paths``, ``limits``, ``diff``). Pure; imports only ``wire``.
"""
