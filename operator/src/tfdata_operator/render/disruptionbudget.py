"""The workers' PodDisruptionBudget: how many a voluntary disruption may take at once (``plan.drain``)."""

from __future__ import annotations

from tfdata_operator.api.spec import ServiceSpec
from tfdata_operator.render.names import WORKER, metadata, selector_labels, workers_name
from tfdata_operator.render.settings import Manifest


def build_worker_pdb(svc: ServiceSpec, max_unavailable: int = 1) -> Manifest | None:
    """How many workers a voluntary disruption (a node drain, an eviction) may take at once.

    ``max_unavailable`` is ``plan.drain``'s: 0 while a client reads a static service (a moved
    worker would read its shard again), else 1. A worker that is not Ready serves nobody, so it
    may always be evicted (``unhealthyPodEvictionPolicy: AlwaysAllow``): it never blocks a drain.
    With "OFF" a replaced worker just starts over, so no budget.
    """
    if svc.sharding_policy == "OFF":
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(svc, workers_name(svc), WORKER),
        "spec": {
            "maxUnavailable": max_unavailable,
            "selector": {"matchLabels": selector_labels(svc, WORKER)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
