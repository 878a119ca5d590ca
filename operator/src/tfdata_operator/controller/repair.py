"""The service's pods that their StatefulSets will not replace by themselves: stuck on an old
revision, registered with an earlier dispatcher, or on a node that stopped answering
(``spec.nodeLoss``, ``plan.nodeloss``). Deleted, so that their StatefulSet recreates them.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from tfdata_operator.api import reasons
from tfdata_operator.controller.interface import Manifest
from tfdata_operator.controller.readers import kept_snapshots
from tfdata_operator.controller.run import Run, read_kept, sooner
from tfdata_operator.plan import hold, nodeloss, scaling
from tfdata_operator.render import builders

log = logging.getLogger(__name__)


def repair_pods(run: Run) -> bool:
    """Pods a StatefulSet will not replace by itself: stuck on an old revision, or registered with an
    earlier dispatcher. Deleted, so that their StatefulSet recreates them."""
    svc, children = run.svc, run.children
    for sts in (run.live.get(("StatefulSet", n)) for n in (builders.dispatcher_name(svc), builders.workers_name(svc))):
        for pod in scaling.stuck_pods(sts, children.pods):
            _replace_pod(run, pod, reasons.RESTARTED_STUCK_POD, "it is not ready and runs an old configuration")
    for pod in scaling.stale_workers(svc, children.pods_of(builders.DISPATCHER), children.pods_of(builders.WORKER)):
        why = ("it registered with an earlier dispatcher pod, and without faultTolerantMode the new dispatcher "
               "hands out task ids the worker still holds")  # fmt: skip
        _replace_pod(run, pod, reasons.RESTARTED_STALE_WORKER, why)
    return True


def replace_lost_pods(run: Run) -> bool:
    """Pods on a node that stopped answering (``plan.nodeloss``): force-deleted, so that their
    StatefulSet recreates them on another node, at once when the node is known to be off (tainted
    out-of-service, or its Node deleted), after a timeout when it is only unreachable and that harms
    nothing. A dispatcher whose journal only that node reaches has its volume set to Retain, then
    loses its claim. Only the Nodes of pods that are not Ready are read (no Node watch: it would hold
    every Node of a big cluster)."""
    svc, readers, namespace = run.svc, run.readers, run.body["metadata"]["namespace"]
    pods = [*run.children.pods_of(builders.DISPATCHER), *run.children.pods_of(builders.WORKER)]
    names = {n for p in pods if (n := nodeloss.node_to_read(p))}
    now = datetime.now(timezone.utc)
    stuck = nodeloss.unscheduled_dispatcher(svc, run.children.pods_of(builders.DISPATCHER), now)
    if not names and stuck is None:
        return True
    nodes = {n: read_kept(run.api, readers, "v1", "Node", None, n) for n in sorted(names)}
    lost = nodeloss.lost_pods(pods, nodes)
    if stuck is not None and (stranded := _stranded_dispatcher(run, stuck)) is not None:
        lost.append(stranded)
    kept: nodeloss.Journal | None = None
    if (dispatcher_lost := nodeloss.journal_to_read(svc, lost, now)) is not None:
        claim = nodeloss.journal_claim(svc, dispatcher_lost.pod)
        assert claim is not None
        bound = read_kept(run.api, readers, "v1", "PersistentVolumeClaim", namespace, claim)
        volume = ((bound or {}).get("spec") or {}).get("volumeName")
        pv = read_kept(run.api, readers, "v1", "PersistentVolume", None, volume) if volume else None
        kept = nodeloss.journal(claim, bound, pv, dispatcher_lost.node)
    saving = None
    if nodeloss.needs_snapshots(svc, lost, now):
        saves, again = kept_snapshots(run.readers, run.dispatcher())
        run.outcome.requeue_after = sooner(run.outcome.requeue_after, again)
        saving = hold.writing(svc, saves)
    run.node_loss = nodeloss.decide(svc, lost, kept, now, saving)
    run.outcome.requeue_after = sooner(run.outcome.requeue_after, run.node_loss.requeue_after)
    for replacement in run.node_loss.replace:
        _replace_lost_pod(run, replacement, kept)
    dispatcher_pod = f"{builders.dispatcher_name(svc)}-0"
    for worker in nodeloss.stranded_workers(run.node_loss, dispatcher_pod, run.children.pods_of(builders.WORKER)):
        why = "it was registered with the dispatcher pod lost with its node, and would not reach the new one"
        _replace_pod(run, worker, reasons.RESTARTED_STALE_WORKER, why)
    # Waits that only certainty ends: a Warning each, once (not again while the condition says so).
    dispatcher, workers = run.node_loss.dispatcher, run.node_loss.workers
    if dispatcher is not None and dispatcher.reason == reasons.DISPATCHER_NODE_LOST:
        _warn_once(run, reasons.DISPATCHER_READY, dispatcher.reason, f"The dispatcher's {dispatcher.message}")
    if workers is not None and workers.reason == reasons.KEPT_FOR_SNAPSHOT:
        _warn_once(run, reasons.WORKERS_READY, workers.reason, f"Kept worker {workers.message}")
    return True


def _replace_lost_pod(run: Run, replacement: nodeloss.Replacement, kept: nodeloss.Journal | None) -> None:
    """One pod lost with its node: its journal's volume kept (Retain) and its claim deleted when the plan
    says so, then the pod force-deleted."""
    svc, namespace = run.svc, run.body["metadata"]["namespace"]
    meta = replacement.pod["metadata"]
    changed = False  # the volume or the claim, now: said even when the pod turns out to be gone already
    if replacement.retain is not None:
        # Before the claim goes: with reclaim Delete (local-path's), the provisioner would delete the old
        # journal's data when the node comes back. A failed patch raises, and nothing is deleted.
        run.api.retain(replacement.retain)
        log.info("%s/%s: set PersistentVolume %s (the journal of pod %s) to Retain", namespace, svc.name,
                 replacement.retain, meta["name"])  # fmt: skip
        changed = True
    if replacement.claim is not None:
        # First, or the StatefulSet controller would recreate the pod on the old claim, bound to the lost
        # node. The claim stays Terminating (pvc-protection) until the pod object is gone, and meanwhile the
        # controller refuses to create the pod ("pvc ... is being deleted", stateful_pod_control.go's
        # createPersistentVolumeClaims) and retries; then it creates a new claim and the pod.
        uid = kept.uid if kept is not None and kept.claim == replacement.claim else None
        changed = run.api.delete("v1", "PersistentVolumeClaim", namespace, replacement.claim, uid=uid) or changed
    # gracePeriodSeconds 0 removes the object at once: no kubelet will ever confirm the pod stopped.
    if run.api.delete("v1", "Pod", namespace, meta["name"], uid=meta.get("uid"), grace_period_seconds=0):
        run.record(replacement.reason, replacement.message, replacement.event_type)
        run.outcome.result = "changed"
    elif changed:
        # Kubernetes deleted the pod first (a node tainted out-of-service: the pod garbage collector).
        run.record(replacement.reason, replacement.gone or replacement.message, replacement.event_type)
        run.outcome.result = "changed"


def _warn_once(run: Run, condition: str, reason: str, message: str) -> None:
    """A Warning Event, unless the service's ``condition`` already has that reason (it was sent then)."""
    old = (run.body.get("status") or {}).get("conditions") or []
    if not any(c.get("type") == condition and c.get("reason") == reason for c in old):
        run.record(reason, message, "Warning")


def _stranded_dispatcher(run: Run, pod: Manifest) -> nodeloss.Lost | None:
    """An unscheduled dispatcher pod whose journal claim is bound to a volume pinned to a node that is
    known to be off (``nodeloss.stranded_dispatcher``): its claim, volume and that node are read (each
    kept NODE_READ_SECONDS). A claim not bound yet (a new service) costs one read."""
    claim = nodeloss.journal_claim(run.svc, pod)
    assert claim is not None
    bound = read_kept(run.api, run.readers, "v1", "PersistentVolumeClaim", run.svc.namespace, claim)
    volume = ((bound or {}).get("spec") or {}).get("volumeName")
    pv = read_kept(run.api, run.readers, "v1", "PersistentVolume", None, volume) if volume else None
    node = nodeloss.pinned_node(pv)
    if node is None:
        return None
    return nodeloss.stranded_dispatcher(pod, node, read_kept(run.api, run.readers, "v1", "Node", None, node))


def _replace_pod(run: Run, pod: Manifest, reason: str, why: str) -> None:
    meta = pod["metadata"]
    if run.api.delete("v1", "Pod", meta["namespace"], meta["name"], uid=meta.get("uid")):
        run.record(reason, f"Deleted pod {meta['name']}: {why}")
        run.outcome.result = "changed"
