"""The order of a worker-count change: who moves first, the dispatcher or the workers.

For the static sharding policies the dispatcher reads its worker list only when it
starts, and TensorFlow kills a worker whose address is missing from that list. So no
worker may ever run while missing from the running dispatcher's list:

- scaling up, the dispatcher restarts with the longer list first, and the workers are
  added only once its new pod has started with that list;
- scaling down, the workers go first, and the dispatcher restarts with the shorter
  list only once their pods are gone.

DYNAMIC and "OFF" have no worker list: the workers follow the spec at once.
Pure functions of the live objects, so the plan is the same whoever computes it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tfdata_operator.api.spec import ServiceSpec

Manifest = dict[str, Any]


@dataclass(frozen=True)
class ScaleStep:
    """What to apply in this reconcile: the dispatcher's list length and the worker replicas."""

    dispatcher_workers: int
    worker_replicas: int
    waiting: str | None = None


def statefulset_settled(sts: Manifest | None) -> bool:
    """True when every pod of the StatefulSet runs its current template and is ready."""
    if not sts:
        return False
    spec, status = sts.get("spec", {}), sts.get("status") or {}
    replicas = spec.get("replicas", 1)
    return (
        status.get("observedGeneration", 0) >= sts.get("metadata", {}).get("generation", 1)
        and status.get("updatedReplicas", 0) == replicas
        and status.get("readyReplicas", 0) == replicas
        and status.get("replicas", 0) == replicas
        and status.get("currentRevision") == status.get("updateRevision")
    )


def suspended(sts: Manifest | None) -> bool:
    """Whether the StatefulSet runs no pod on purpose (spec.suspend)."""
    return sts is not None and int(sts.get("spec", {}).get("replicas", 1)) == 0


def live_worker_list(dispatcher_config: dict[str, Any] | None) -> list[str] | None:
    if dispatcher_config is None:
        return None
    addresses = dispatcher_config.get("worker_addresses")
    return list(addresses) if isinstance(addresses, list) else None


def highest_ordinal_plus_one(pod_names: Iterable[str], statefulset_name: str) -> int:
    """How many worker slots are taken by pods that still exist (terminating ones included)."""
    pattern = re.compile(rf"^{re.escape(statefulset_name)}-(\d+)$")
    ordinals = [int(m.group(1)) for name in pod_names if (m := pattern.match(name))]
    return max(ordinals, default=-1) + 1


def started_on_current_revision(sts: Manifest | None, pods: list[Manifest]) -> bool:
    """Whether the StatefulSet's pod 0 runs its latest template and its server has started.

    Started, not ready: a static dispatcher is ready only once every listed worker has
    registered, so new workers must be able to come up while it waits for them.
    """
    if not sts:
        return False
    status = sts.get("status") or {}
    if status.get("observedGeneration", 0) < sts.get("metadata", {}).get("generation", 1):
        return False
    name = f"{sts['metadata']['name']}-0"
    for pod in pods:
        meta = pod["metadata"]
        if meta["name"] != name or meta.get("deletionTimestamp"):
            continue
        if meta.get("labels", {}).get("controller-revision-hash") != status.get("updateRevision"):
            return False
        containers = (pod.get("status") or {}).get("containerStatuses") or []
        started = any(c.get("started") or "running" in (c.get("state") or {}) for c in containers)
        return started or pod_ready(pod)
    return False


def step(
    svc: ServiceSpec,
    live_workers: Manifest | None,
    live_dispatcher: Manifest | None,
    dispatcher_pods: list[Manifest],
    live_dispatcher_list: list[str] | None,
    list_for: Callable[[int], list[str]],
    worker_pods_present: int,
) -> ScaleStep:
    """Decides this step of a scale change; ``list_for(n)`` is the static list for n workers."""
    desired = svc.workers.replicas
    if not svc.is_static or live_workers is None:
        # No worker list to respect, or a new service: the dispatcher's list covers every worker from the start.
        return ScaleStep(desired, desired)

    current = int(live_workers.get("spec", {}).get("replicas", 0))
    # The list always covers every worker pod that still exists, even one that is stopping.
    dispatcher_workers = max(desired, worker_pods_present)
    if desired > current:
        # A suspended dispatcher (no pod) starts with the live list when it resumes, so no running
        # dispatcher lacks a worker of it.
        dispatcher_moved = started_on_current_revision(live_dispatcher, dispatcher_pods) or suspended(live_dispatcher)
        if live_dispatcher_list == list_for(dispatcher_workers) and dispatcher_moved:
            return ScaleStep(dispatcher_workers, desired)
        return ScaleStep(
            dispatcher_workers,
            current,
            f"Scaling up from {current} to {desired} workers: waiting for the dispatcher to restart "
            f"with the {dispatcher_workers}-worker list before adding workers",
        )
    if dispatcher_workers > desired:
        return ScaleStep(
            dispatcher_workers,
            desired,
            f"Scaling down to {desired} workers: waiting for {dispatcher_workers - desired} worker pod(s) "
            "to stop before the dispatcher restarts with the shorter list",
        )
    return ScaleStep(desired, desired)


def pod_ready(pod: Manifest) -> bool:
    """Whether the pod's Ready condition is True."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def stuck_pods(sts: Manifest | None, pods: list[Manifest]) -> list[Manifest]:
    """Pods of ``sts`` that are not ready and still run an old revision.

    The StatefulSet controller's rolling update waits for an unhealthy pod to become
    healthy before replacing it, which never happens when the old template is what
    keeps it from starting (a bad image, a dispatcher that cannot start). Such a pod
    serves nothing, so deleting it lets the controller recreate it from the new template.
    """
    if not sts:
        return []
    status = sts.get("status") or {}
    update = status.get("updateRevision")
    rolled_out = update == status.get("currentRevision") and status.get("updatedReplicas") == status.get("replicas")
    if not update or rolled_out:
        return []
    prefix = sts["metadata"]["name"] + "-"
    uid = sts["metadata"].get("uid")
    return [
        p
        for p in pods
        if p["metadata"]["name"].startswith(prefix)
        and any(ref.get("uid") == uid for ref in p["metadata"].get("ownerReferences") or [])
        and p["metadata"]["name"][len(prefix) :].isdigit()
        and p["metadata"].get("labels", {}).get("controller-revision-hash") not in (None, update)
        and not p["metadata"].get("deletionTimestamp")
        and not pod_ready(p)
    ]


def _ready_since(pod: Manifest) -> str | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            since = c.get("lastTransitionTime")
            return since if isinstance(since, str) else None
    return None


def stale_workers(svc: ServiceSpec, dispatcher_pods: list[Manifest], worker_pods: list[Manifest]) -> list[Manifest]:
    """Workers that registered with an earlier dispatcher pod, when the dispatcher keeps no journal.

    Without faultTolerantMode a new dispatcher starts from nothing and hands out task ids
    from the start again, while a worker that kept running still holds tasks of those ids
    from before; TensorFlow's worker then answers a new task with the old one (end of
    sequence, or elements of another dataset). Such a worker was created, and ready, before
    the current dispatcher pod was created. The creation times both come from the API
    server's clock, so a replacement worker is never taken for a stale one. (A dispatcher
    container restarting in place, in the same pod, is not detected.) RFC 3339 timestamps
    in UTC compare as strings.
    """
    if svc.dispatcher.fault_tolerant_mode:
        return []  # the journal carries the task ids across restarts
    live = [p for p in dispatcher_pods if not p["metadata"].get("deletionTimestamp")]
    if len(live) != 1 or not isinstance(created := live[0]["metadata"].get("creationTimestamp"), str):
        return []  # no current dispatcher pod (yet)
    stale = []
    for pod in worker_pods:
        meta = pod["metadata"]
        since = _ready_since(pod)
        if meta.get("deletionTimestamp") or since is None:
            continue
        if str(meta.get("creationTimestamp", "")) < created and since < created:
            stale.append(pod)
    return stale
