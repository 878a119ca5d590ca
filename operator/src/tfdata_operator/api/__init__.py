"""The API: the TFDataService resource as the operator reads it.

Its spec parsed, defaulted and validated (``spec``), and the Kubernetes core types it embeds
(``coretypes``). Pure; imports only ``wire``.
"""
