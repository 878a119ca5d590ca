"""Render: a parsed spec in, the manifests of its children out. Pure.

``builders`` holds the render function of each child kind and the names callers use; each kind
is built in its own module (``dispatcher``, ``workers``, ``services``, ``clientconfigmap``,
``hpa``, ``disruptionbudget``, ``networkpolicy``) on the shared ``pod``, ``podconfig``,
``journal``, ``names`` and ``settings``.
"""
