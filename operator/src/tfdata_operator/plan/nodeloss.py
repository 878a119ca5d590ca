"""Pods on a node that stopped answering (``spec.nodeLoss``): which to replace now, which later, which
never without certainty, and what the status says meanwhile.

When a node stops answering, the node lifecycle controller sets its Ready condition to Unknown,
taints it ``node.kubernetes.io/unreachable`` (NoExecute, with the taint's ``timeAdded``) and marks
its pods not Ready; 300 s later (the default toleration) it deletes them, and they stay
Terminating: only the node's kubelet could confirm they stopped. A StatefulSet never makes a second
pod of the same name, so without a person the service stays short of that pod. This module decides
when the operator force-deletes it instead, so that its StatefulSet recreates it on another node.

What is certain and what is guessed (Kubernetes' non-graceful node shutdown, KEP-2268, is the model):

- Certain: the node is tainted ``node.kubernetes.io/out-of-service`` (a person or a fencing agent found
  it shut down) and is not Ready, or its Node object was deleted. Every pod there is replaced at
  once, the dispatcher too, whatever ``spec.nodeLoss.dispatcher`` says.
- Guessed: only the unreachable taint, for a while. A node that is slow (a kubelet starved of memory,
  a switch flap) looks the same, and comes back with its pods still running. So on a guess only
  what holds no state goes: a worker after ``replaceAfterSeconds``, unless a snapshot is being written
  (its stream would get a second writer: it is kept, ``KeptForSnapshot``). The dispatcher, with ``Recover``, after
  ``dispatcherReplaceAfterSeconds`` (300 s, Kubernetes' own eviction, by default), and only where a
  second dispatcher cannot write the same journal: none kept, or a journal only the lost node reaches
  (which is kept: its volume is set to ``Retain`` before its claim is let go, and the status and a
  Warning Event say which volume holds it). A journal other nodes reach waits for certainty unless
  ``spec.nodeLoss.fencedBy`` names who fences.
- Never acted on: ``node.kubernetes.io/not-ready`` (the kubelet is alive there and handles its pods),
  a Ready node (a taint left on a node that answers again), and no timeout below 30 s.

Pure: the reconcile (``controller/repair.py``) reads the Nodes of unready pods only
(``node_to_read``), the journal's claim and volume only for a dispatcher that may be replaced now
(``journal_to_read``), and the snapshots only for a worker due on a guess (``needs_snapshots``).
docs/operations.md ("Node failure") gives the split-brain argument.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tfdata_operator.api import coretypes, limits, reasons, spec
from tfdata_operator.api.spec import JOURNAL_VOLUME, ServiceSpec
from tfdata_operator.plan.diagnose import Finding
from tfdata_operator.plan.scaling import pod_ready
from tfdata_operator.render import builders

Manifest = dict[str, Any]

# Set by the node lifecycle controller while a node's Ready condition is Unknown (no heartbeat).
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
# Set by a person or a fencing agent who verified that the node is shut down (KEP-2268).
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
# The label every kubelet sets to its node's name; local-path and local volumes pin themselves to it.
HOSTNAME_LABEL = "kubernetes.io/hostname"
# While a pod waits on a guess, its node is read again this often: an out-of-service taint or a
# deleted Node is acted on within this (plus the read's cache, run.NODE_READ_SECONDS).
RECHECK_SECONDS = 10.0
RETAIN = "Retain"
# For sentences: what makes a node's loss certain.
CERTAINTY = f"the node is tainted {OUT_OF_SERVICE_TAINT} or its Node is deleted"


@dataclass(frozen=True)
class Lost:
    """A pod of the service on a node that stopped answering."""

    pod: Manifest
    node: str
    # When the node was tainted unreachable or out-of-service (None: not known, e.g. a deleted Node).
    since: datetime | None
    # Why the node is known to be off, for a sentence; None: it is only unreachable (a guess).
    certain: str | None = None

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])


@dataclass(frozen=True)
class Journal:
    """A lost dispatcher's journal claim as read, and its volume."""

    claim: str
    uid: str | None = None
    volume: str | None = None  # the PersistentVolume's name; None: not bound, or not read
    node_local: bool = False
    retained: bool = False  # its persistentVolumeReclaimPolicy is Retain already
    path: str | None = None  # where on the node the data is (local or hostPath volumes)


@dataclass(frozen=True)
class Replacement:
    """A pod to force-delete; first, when set, ``retain`` (a volume set to Retain) and ``claim`` (deleted).

    ``message`` is the Event's once the pod is deleted; ``gone`` (when set) the Event's when the pod
    was deleted before the operator got to it (Kubernetes deletes the pods of a node tainted
    out-of-service itself) while its volume or claim still changed now: the journal was let go all the
    same, and the user must hear of it.
    """

    pod: Manifest
    reason: str
    message: str
    event_type: str = "Normal"
    claim: str | None = None
    retain: str | None = None
    gone: str | None = None


@dataclass(frozen=True)
class NodeLoss:
    """What to do now, what each StatefulSet's condition says meanwhile, and when to look again."""

    replace: list[Replacement] = field(default_factory=list)
    dispatcher: Finding | None = None
    workers: Finding | None = None
    # Seconds until a pending replacement is due, or the lost node is read again.
    requeue_after: float | None = None


def node_to_read(pod: Manifest) -> str | None:
    """The node of a pod that is not Ready (the node lifecycle controller marks the pods of an
    unreachable node so, which is what brings the reconcile here); None for a pod that is Ready
    or not scheduled: its node is not read at all."""
    node = (pod.get("spec") or {}).get("nodeName")
    return None if not node or pod_ready(pod) else str(node)


def node_state(node: Manifest | None) -> tuple[str | None, datetime | None] | None:
    """Whether a node (as read; None: it does not exist) lost its pods: ``(certain, since)``, where
    ``certain`` says why it is known to be off (None: only unreachable, a guess) and ``since`` is when
    its taint was added; None while it is Ready, or not tainted so."""
    if node is None:
        return "its Node object was deleted", None
    status = node.get("status") or {}
    if any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
        return None  # it answers again: its kubelet handles its pods (as the pod garbage collector checks)
    taints = (node.get("spec") or {}).get("taints") or []
    for taint in taints:
        if taint.get("key") == OUT_OF_SERVICE_TAINT:
            why = f"it is tainted {OUT_OF_SERVICE_TAINT} (someone found it shut down)"
            return why, coretypes.parse_time(taint.get("timeAdded"))
    for taint in taints:
        if taint.get("key") == UNREACHABLE_TAINT and taint.get("effect") == "NoExecute":
            return None, coretypes.parse_time(taint.get("timeAdded"))
    return None


def lost_pods(pods: Sequence[Manifest], nodes: Mapping[str, Manifest | None]) -> list[Lost]:
    """The pods (of ``node_to_read``) whose node, as read into ``nodes``, lost them."""
    lost = []
    for pod in pods:
        name = node_to_read(pod)
        state = node_state(nodes[name]) if name is not None and name in nodes else None
        if name is not None and state is not None:
            certain, since = state
            if certain is not None or since is not None:  # an unreachable taint without a time: not yet
                lost.append(Lost(pod, name, since, certain))
    return lost


# What kube-scheduler's VolumeBinding plugin says of a node that a bound volume's node affinity rules
# out (ErrReasonNodeConflict; the older wording too): the only case where a stranded journal is
# possible. A pod waiting for a claim not bound yet, or for any node at all, says something else and
# costs no read, so a settled namespace with an unready service sends nothing more per resync.
PINNED_VOLUME_WORDS = ("didn't match PersistentVolume's node affinity", "volume node affinity conflict")


def unscheduled_dispatcher(svc: ServiceSpec, pods: Sequence[Manifest], now: datetime) -> Manifest | None:
    """A dispatcher pod with a journal claim that the scheduler has found no node for, for RECHECK_SECONDS
    at least (its PodScheduled condition): its claim may be bound to a volume on a node that is gone. The
    pod garbage collector deletes the pods of a deleted or out-of-service node by itself, and the
    StatefulSet's new pod then waits for that node for good. A pod that is only starting, or that the
    scheduler holds back for anything but its volume's node affinity, costs no read."""
    if not svc.dispatcher.storage.enabled:
        return None
    for pod in pods:
        if not is_dispatcher(svc, pod) or (pod.get("spec") or {}).get("nodeName"):
            continue
        if pod["metadata"].get("deletionTimestamp"):
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        unscheduled = next(
            (c for c in conditions if c.get("type") == "PodScheduled" and c.get("status") == "False"), None
        )
        if not any(w in str((unscheduled or {}).get("message", "")) for w in PINNED_VOLUME_WORDS):
            continue
        since = coretypes.parse_time((unscheduled or {}).get("lastTransitionTime"))
        if since is not None and now >= since + timedelta(seconds=RECHECK_SECONDS):
            return pod
    return None


def pinned_node(volume: Manifest | None) -> str | None:
    """The one node a volume's required node affinity names by hostname (a local-path or local volume), if any."""
    terms = ((((volume or {}).get("spec") or {}).get("nodeAffinity") or {}).get("required") or {}).get(
        "nodeSelectorTerms"
    ) or []
    names = {
        value
        for term in terms
        for e in term.get("matchExpressions") or []
        if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "In"
        for value in e.get("values") or []
    }
    return next(iter(names)) if len(names) == 1 and all(_pins_to(t, next(iter(names))) for t in terms) else None


def stranded_dispatcher(pod: Manifest, node: str, read: Manifest | None) -> Lost | None:
    """An unscheduled dispatcher pod whose journal's volume is pinned to ``node`` (as read: None, deleted),
    as a lost pod of that node when the node is known to be off; None otherwise (it waits for the node)."""
    state = node_state(read)
    if state is None or state[0] is None:
        return None
    return Lost(pod, node, state[1], state[0])


def is_dispatcher(svc: ServiceSpec, pod: Manifest) -> bool:
    return str(pod["metadata"]["name"]).startswith(builders.dispatcher_name(svc) + "-")


def journal_claim(svc: ServiceSpec, pod: Manifest) -> str | None:
    """The name of a dispatcher pod's journal claim, if the spec gives it one: the StatefulSet
    controller names a volumeClaimTemplates claim ``<template>-<pod>``."""
    return (
        f"{JOURNAL_VOLUME}-{pod['metadata']['name']}"
        if is_dispatcher(svc, pod) and svc.dispatcher.storage.enabled
        else None
    )


def journal(claim: str, bound: Manifest | None, volume: Manifest | None, node: str) -> Journal:
    """What the reconcile read of a journal claim (``bound``) and its volume, for ``decide``."""
    meta, pv = (bound or {}).get("metadata") or {}, (volume or {}).get("spec") or {}
    return Journal(
        claim=claim,
        uid=meta.get("uid"),
        volume=((bound or {}).get("spec") or {}).get("volumeName") or None,
        node_local=node_local(volume, node),
        retained=pv.get("persistentVolumeReclaimPolicy") == RETAIN,
        path=(pv.get("local") or pv.get("hostPath") or {}).get("path"),
    )


def node_local(volume: Manifest | None, node: str) -> bool:
    """Whether a PersistentVolume can be reached only from ``node``: a ``local`` or ``hostPath``
    volume, or one whose required node affinity names that node's hostname and nothing else (as
    the local-path provisioner's volumes do). A zonal disk or a network share is not; a volume
    that could not be read counts as not node-local (its claim is kept)."""
    if volume is None:
        return False
    pv = volume.get("spec") or {}
    if pv.get("local") or pv.get("hostPath"):
        return True
    terms = (((pv.get("nodeAffinity") or {}).get("required") or {}).get("nodeSelectorTerms")) or []
    return bool(terms) and all(_pins_to(term, node) for term in terms)


def _pins_to(term: Mapping[str, Any], node: str) -> bool:
    return any(
        e.get("key") == HOSTNAME_LABEL and e.get("operator") == "In" and set(e.get("values") or []) == {node}
        for e in term.get("matchExpressions") or []
    )


def after_seconds(svc: ServiceSpec, lost: Lost) -> int:
    """How long a guess must last before the pod is replaced (as used: at least 30 s)."""
    loss = svc.node_loss
    return loss.dispatcher_after if is_dispatcher(svc, lost.pod) else loss.worker_after


def due(lost: Lost, svc: ServiceSpec, now: datetime) -> bool:
    """Whether ``lost`` may be acted on now: its node is known to be off, or has been unreachable for its
    timeout (``replaceAfterSeconds`` for a worker, ``dispatcherReplaceAfterSeconds`` for the dispatcher)."""
    if lost.certain is not None:
        return True
    assert lost.since is not None
    return now >= lost.since + timedelta(seconds=after_seconds(svc, lost))


def journal_to_read(svc: ServiceSpec, lost: Sequence[Lost], now: datetime) -> Lost | None:
    """The lost dispatcher whose journal claim and volume ``decide`` needs: one that may be replaced now
    (its node is known to be off, or, with Recover, its timeout is over) and has a claim."""
    for one in lost:
        may = one.certain is not None or svc.node_loss.dispatcher == spec.NODE_LOSS_RECOVER
        if journal_claim(svc, one.pod) is not None and may and due(one, svc, now):
            return one
    return None


def needs_snapshots(svc: ServiceSpec, lost: Sequence[Lost], now: datetime) -> bool:
    """Whether ``decide`` needs the dispatcher's snapshots: a worker is due on a guess, and the
    dispatcher is fault-tolerant (the only kind TensorFlow lets snapshot)."""
    return svc.dispatcher.fault_tolerant_mode and any(
        one.certain is None and not is_dispatcher(svc, one.pod) and due(one, svc, now) for one in lost
    )


def decide(
    svc: ServiceSpec,
    lost: Sequence[Lost],
    kept: Journal | None,
    now: datetime,
    saving: str | None = None,
) -> NodeLoss:
    """What to do with the service's pods on nodes that stopped answering.

    ``kept``: the dispatcher's journal claim and volume, as read (``journal_to_read``; None: not read,
    or it has none). ``saving``: which snapshots are being written (``hold.writing``), read only when
    ``needs_snapshots``; a worker due on a guess waits while one is.
    """
    replace: list[Replacement] = []
    waits: list[float] = []
    dispatcher: Finding | None = None
    workers: list[str] = []
    workers_reason = reasons.REPLACED_LOST_POD
    for one in lost:
        where = _where(one)
        if is_dispatcher(svc, one.pod):
            found, replacement, wait = _dispatcher(svc, one, where, kept, now)
            dispatcher = found
            if replacement is not None:
                replace.append(replacement)
            if wait is not None:
                waits.append(wait)
            continue
        setting = svc.node_loss.worker_after
        if one.certain is not None:
            why = f"Deleted pod {one.name} at once: {where}; its StatefulSet recreates it on another node"
            replace.append(Replacement(one.pod, reasons.REPLACED_LOST_POD, why))
            workers.append(why)
        elif not due(one, svc, now):
            assert one.since is not None
            at = _format(one.since + timedelta(seconds=setting))
            workers.append(f"pod {one.name}: {where}; it is replaced at {at} ({_setting(svc, False)}), or at once "
                           f"when {CERTAINTY}")  # fmt: skip
            waits.append(max(0.5, min(RECHECK_SECONDS, setting - (now - one.since).total_seconds())))
            if workers_reason != reasons.KEPT_FOR_SNAPSHOT:  # the wait that ends only on certainty says so
                workers_reason = reasons.NODE_UNREACHABLE
        elif saving is not None:
            workers.append(
                f"pod {one.name}: {where}, but {saving}: a new worker would write the same stream while the one on "
                f"that node may still be writing it. It is replaced once {CERTAINTY}"
            )
            waits.append(RECHECK_SECONDS)
            workers_reason = reasons.KEPT_FOR_SNAPSHOT
        else:
            why = (f"Deleted pod {one.name}: {where} (over {_setting(svc, False)}; a worker keeps no state, so "
                   "a node that is only slow loses nothing); its StatefulSet recreates it on another node")  # fmt: skip
            replace.append(Replacement(one.pod, reasons.REPLACED_LOST_POD, why))
            workers.append(why)
    return NodeLoss(
        replace=replace,
        dispatcher=dispatcher,
        workers=Finding(workers_reason, "; ".join(workers)) if workers else None,
        requeue_after=min(waits) if waits else None,
    )


def stranded_workers(decision: NodeLoss, dispatcher_pod: str, workers: Sequence[Manifest]) -> list[Manifest]:
    """The workers to restart when the dispatcher pod ``dispatcher_pod`` is replaced now: every worker
    not itself being replaced nor already going. A worker's heartbeat to the lost dispatcher was sent
    to an address that no longer answers, and a silent peer never closes the connection (TensorFlow
    sets no keepalive on it), so the worker would not reach the new dispatcher for as long as its
    ``dispatcher_timeout_ms``; and after a fresh journal the new dispatcher hands out task ids the
    workers still hold. A restarted worker registers with the new dispatcher at once."""
    if not any(r.pod["metadata"].get("name") == dispatcher_pod for r in decision.replace):
        return []
    going = {r.pod["metadata"].get("name") for r in decision.replace}
    return [w for w in workers if w["metadata"].get("name") not in going and not w["metadata"].get("deletionTimestamp")]


def _dispatcher(
    svc: ServiceSpec, one: Lost, where: str, kept: Journal | None, now: datetime
) -> tuple[Finding, Replacement | None, float | None]:
    """The lost dispatcher: its condition's finding, its replacement (if now), and when to look again."""
    loss = svc.node_loss
    if one.certain is None and loss.dispatcher == spec.NODE_LOSS_WAIT:
        return Finding(reasons.DISPATCHER_NODE_LOST, _wait_message(one, where)), None, RECHECK_SECONDS
    if not due(one, svc, now):
        assert one.since is not None
        at = _format(one.since + timedelta(seconds=loss.dispatcher_after))
        pending = (f"pod {one.name}: {where}; it is replaced at {at} ({_setting(svc, True)}), or at once when "
                   f"{CERTAINTY}")  # fmt: skip
        lost_for = (now - one.since).total_seconds()
        return (
            Finding(reasons.NODE_UNREACHABLE, pending),
            None,
            max(0.5, min(RECHECK_SECONDS, loss.dispatcher_after - lost_for)),
        )
    claim = journal_claim(svc, one.pod)
    local = claim is not None and kept is not None and kept.claim == claim and kept.node_local
    shared = svc.dispatcher.fault_tolerant_mode and not local
    if one.certain is None and shared and loss.fenced_by is None:
        return Finding(reasons.DISPATCHER_NODE_LOST, _unfenced_message(one, where)), None, RECHECK_SECONDS
    replacement = _dispatcher_replacement(svc, one, where, kept if local else None)
    # What the status says until the new pod changes it (the Event stays).
    return Finding(replacement.reason, replacement.message), replacement, None


def _dispatcher_replacement(svc: ServiceSpec, one: Lost, where: str, kept: Journal | None) -> Replacement:
    over = "" if one.certain is not None else f" (over {_setting(svc, True)})"
    head = f"Deleted the dispatcher pod {one.name} at once: {where}{over}"
    gone = f"The dispatcher pod {one.name} was already deleted (by Kubernetes): {where}{over}"
    if kept is not None:
        volume = f"volume {kept.volume}" if kept.volume else "its volume"
        at = f" ({kept.path} on node {one.node})" if kept.path else f" (on node {one.node})"
        retain = "was already" if kept.retained else "was first set to"
        said = (
            f". Its journal claim {kept.claim} was let go (only that node reaches its volume); the {volume}"
            f"{at} {retain} persistentVolumeReclaimPolicy Retain, so the old journal is kept there. The new "
            "dispatcher starts elsewhere on a fresh journal: the jobs that were running are lost, and clients must "
            'start new ones. To replay the old journal instead, see docs/operations.md, "Recovering a kept '
            'journal".'
        )
        return Replacement(
            one.pod,
            reasons.JOURNAL_LOST,
            f"{head}{said}",
            "Warning",
            kept.claim,
            kept.volume if kept.volume and not kept.retained else None,
            gone=f"{gone}{said}",
        )
    if not svc.dispatcher.fault_tolerant_mode:
        return Replacement(
            one.pod,
            reasons.JOURNAL_LOST,
            f"{head}. Without faultTolerantMode it keeps no journal: the new dispatcher starts elsewhere with no "
            "jobs, so the jobs that were running are lost, and clients must start new ones.",
            "Warning",
        )
    fenced = (
        ""
        if one.certain is not None
        else f" (spec.nodeLoss.fencedBy says the node is fenced: {limits.clip(svc.node_loss.fenced_by or '', 256)})"
    )
    return Replacement(
        one.pod,
        reasons.REPLACED_LOST_POD,
        f"{head}. The new dispatcher starts on another node and replays its journal, which other nodes reach"
        f"{fenced}: the running jobs go on.",
    )


def _where(one: Lost) -> str:
    if one.certain is not None:
        return f"its node {one.node} is known to be off: {one.certain}"
    assert one.since is not None
    since = _format(one.since)
    return f"its node {one.node} has been unreachable since {since} (a guess: a node that is only slow looks the same)"


def _setting(svc: ServiceSpec, dispatcher: bool) -> str:
    loss = svc.node_loss
    key, value = (
        ("dispatcherReplaceAfterSeconds", loss.dispatcher_replace_after_seconds)
        if dispatcher
        else ("replaceAfterSeconds", loss.replace_after_seconds)
    )
    used = max(spec.MIN_REPLACE_AFTER_SECONDS, value)
    if used != value:
        return f"spec.nodeLoss.{key} {value}, used as {used}: no timeout is shorter than {used} s"
    return f"spec.nodeLoss.{key} {value}"


def _wait_message(one: Lost, where: str) -> str:
    return (
        f"pod {one.name}: {where}, and spec.nodeLoss.dispatcher is Wait, so it is replaced only once {CERTAINTY}. "
        f"Bring the node back; or, once you know it is off, taint it: `kubectl taint node {one.node} "
        f"{OUT_OF_SERVICE_TAINT}=nodeshutdown:NoExecute` (the operator then replaces the pod at once, and keeps a "
        "journal only that node holds on its volume)."
    )


def _unfenced_message(one: Lost, where: str) -> str:
    return (
        f"pod {one.name}: {where}. Its journal is one other nodes reach, so a new dispatcher would write it while "
        "the one on that node may still be writing it, and nothing says the node is fenced: it is replaced only "
        f"once {CERTAINTY}. Bring the node back; or, once you know it is off, taint it: `kubectl taint node "
        f"{one.node} {OUT_OF_SERVICE_TAINT}=nodeshutdown:NoExecute`; or set spec.nodeLoss.fencedBy to say what "
        "fences such nodes."
    )


def _format(when: datetime) -> str:
    return when.strftime(coretypes.TIME_FORMAT)
