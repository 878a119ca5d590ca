"""The plan: what a service's children should be, and what its status says. Pure.

The child-kind table (``children``), the worker counts (``scaling``), holding worker
removal while readers need it (``hold``), the workers' disruption budget while readers need
it (``drain``), the desired children (``desired``), the status (``status``), the explanation
of pods that do not run (``diagnose``) and the pods to replace on a lost node (``nodeloss``).
"""
