"""The Kueue Workload a queued TFDataService is admitted through (``plan/kueue.py`` decides when).

One Workload per service, written by the operator: pod sets ``dispatcher`` (1 pod) and
``workers`` (the worker count; with autoscaling the most it may scale to, and the least it runs
with as ``minCount``, so that Kueue may admit fewer), each with the pod template its
StatefulSet runs before Kueue's flavors are merged in. Owned by the service, so the garbage
collector deletes it with it; labelled like the children, so the operator's watch sees it. No
``kueue.x-k8s.io/*`` label reaches the StatefulSets or their pods.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from tfdata_operator.api import kueue
from tfdata_operator.api.spec import ServiceSpec
from tfdata_operator.render.names import MANAGED_BY, instance_labels, owner_reference
from tfdata_operator.render.settings import Manifest

# metadata.name is a DNS subdomain; the prefix keeps room for the hash.
_MAX_PREFIX = 253 - 6


def workload_name(svc: ServiceSpec) -> str:
    """``tfdataservice-<name>-<5 hex>``, the hash of the service's name and uid (as Kueue names
    the Workloads of its own integrations): a service deleted and made again gets a new one."""
    digest = hashlib.sha1(f"{svc.name}/{svc.uid}".encode()).hexdigest()[:5]
    return f"tfdataservice-{svc.name}"[:_MAX_PREFIX] + f"-{digest}"


def worker_counts(svc: ServiceSpec) -> tuple[int, int | None]:
    """The workers pod set's ``count`` and ``minCount``: with autoscaling, the most and the least
    the service runs with (Kueue may admit any count between them); else the worker count."""
    if svc.autoscaling is not None:
        return svc.autoscaling.max_replicas, max(1, svc.autoscaling.min_replicas)
    return svc.workers.replicas, None


def build_workload(
    svc: ServiceSpec, dispatcher_template: Manifest, worker_template: Manifest, priority: int | None = None
) -> Manifest:
    """The Workload; ``priority`` is the value of the service's WorkloadPriorityClass (its label)."""
    count, min_count = worker_counts(svc)
    workers: dict[str, Any] = {"name": kueue.WORKERS_POD_SET, "count": count, "template": _template(worker_template)}
    if min_count is not None and min_count < count:
        workers["minCount"] = min_count
    spec: dict[str, Any] = {
        "queueName": svc.kueue.queue if svc.kueue else "",
        "podSets": [
            {"name": kueue.DISPATCHER_POD_SET, "count": 1, "template": _template(dispatcher_template)},
            workers,
        ],
    }
    if svc.kueue is not None and svc.kueue.priority_class is not None and priority is not None:
        spec["priorityClassRef"] = {
            "group": kueue.GROUP,
            "kind": kueue.PRIORITY_CLASS_KIND,
            "name": svc.kueue.priority_class,
        }
        spec["priority"] = priority
    return {
        "apiVersion": kueue.WORKLOAD_API_VERSION,
        "kind": kueue.WORKLOAD_KIND,
        "metadata": {
            "name": workload_name(svc),
            "namespace": svc.namespace,
            "labels": {**instance_labels(svc), **MANAGED_BY},
            "ownerReferences": [owner_reference(svc)],
        },
        "spec": spec,
    }


def _template(template: Manifest) -> Manifest:
    """A pod template as a pod set takes it: its metadata only labels and annotations."""
    meta = template.get("metadata") or {}
    return {
        "metadata": {k: copy.deepcopy(v) for k, v in meta.items() if k in ("labels", "annotations")},
        "spec": copy.deepcopy(template["spec"]),
    }
