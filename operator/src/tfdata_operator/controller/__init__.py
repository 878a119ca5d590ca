"""The controller: kopf's wiring, the reconcile, the watches' cache and the work queue, every
request to the API server and to the pods (each bounded: ``readers``), the leader election and
the operator's metrics. The only layer that does I/O against the cluster.
"""
