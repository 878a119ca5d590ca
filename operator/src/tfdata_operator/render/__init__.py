"""Render: a parsed spec in, the manifests of its children out (``builders``). Pure."""
