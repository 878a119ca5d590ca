"""Pods on a node that stopped answering (``spec.nodeLoss``): which to replace now, which later, and why.

When a node stops answering, the node lifecycle controller sets its Ready condition to Unknown,
taints it ``node.kubernetes.io/unreachable`` (NoExecute, with the taint's ``timeAdded``) and marks
its pods not Ready; 300 s later (the default toleration) it deletes them, and they stay
Terminating: only the node's kubelet could confirm they stopped. A StatefulSet never makes a second
pod of the same name, so without a person the service stays short of that pod. This module decides
when the operator force-deletes it instead, so that its StatefulSet recreates it on another node:

- only a pod whose node carries the unreachable taint, for ``replaceAfterSeconds`` at least, and
  whose Ready condition is not True (a taint left on a node that answers again is not acted on);
- never for ``node.kubernetes.io/not-ready`` (the kubelet is alive there and handles its pods)
  nor for a Node that is gone (the pod garbage collector deletes pods of deleted nodes);
- a worker always; the dispatcher with ``dispatcher: Recover``, after its journal claim when the
  claim's volume is reachable only from the lost node (``node_local``): the StatefulSet
  controller then creates a new claim and the pod elsewhere, on a fresh journal. With ``Wait``
  the dispatcher is left for a person, and the status says how.

Pure: the reconcile (``controller/reconcile.py``) reads the Nodes of unready pods only
(``node_to_read``) and the journal's volume only for a dispatcher due for replacement.
docs/operations.md ("Node failure") gives the split-brain argument.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tfdata_operator.api import coretypes, reasons, spec
from tfdata_operator.api.spec import JOURNAL_VOLUME, ServiceSpec
from tfdata_operator.plan.diagnose import Finding
from tfdata_operator.plan.scaling import pod_ready
from tfdata_operator.render import builders

Manifest = dict[str, Any]

# Set by the node lifecycle controller while a node's Ready condition is Unknown (no heartbeat).
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
# The label every kubelet sets to its node's name; local-path and local volumes pin themselves to it.
HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class Lost:
    """A pod of the service on a node Kubernetes marked unreachable."""

    pod: Manifest
    node: str
    since: datetime  # the taint's timeAdded

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])


@dataclass(frozen=True)
class Replacement:
    """A pod to force-delete (and, first, the dispatcher's journal claim, when ``claim`` is set)."""

    pod: Manifest
    reason: str
    message: str
    event_type: str = "Normal"
    claim: str | None = None


@dataclass(frozen=True)
class NodeLoss:
    """What to do now, what each StatefulSet's condition says meanwhile, and when to look again."""

    replace: list[Replacement] = field(default_factory=list)
    dispatcher: Finding | None = None
    workers: Finding | None = None
    # Seconds until the earliest pending replacement is due.
    requeue_after: float | None = None


def node_to_read(pod: Manifest) -> str | None:
    """The node of a pod that is not Ready (the node lifecycle controller marks the pods of an
    unreachable node so, which is what brings the reconcile here); None for a pod that is Ready
    or not scheduled: its node is not read at all."""
    node = (pod.get("spec") or {}).get("nodeName")
    return None if not node or pod_ready(pod) else str(node)


def unreachable_since(node: Manifest | None) -> datetime | None:
    """When the node was tainted unreachable; None while it is Ready, not tainted so, or gone."""
    if node is None:
        return None  # the pod garbage collector deletes the pods of a deleted node
    status = node.get("status") or {}
    if any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
        return None
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("key") == UNREACHABLE_TAINT and taint.get("effect") == "NoExecute":
            return coretypes.parse_time(taint.get("timeAdded"))
    return None


def lost_pods(pods: Sequence[Manifest], nodes: Mapping[str, Manifest | None]) -> list[Lost]:
    """The pods (of ``node_to_read``) whose node, as read into ``nodes``, is unreachable."""
    lost = []
    for pod in pods:
        name = node_to_read(pod)
        since = unreachable_since(nodes.get(name)) if name else None
        if name and since is not None:
            lost.append(Lost(pod, name, since))
    return lost


def journal_claim(svc: ServiceSpec, pod: Manifest) -> str | None:
    """The name of a dispatcher pod's journal claim, if the spec gives it one: the StatefulSet
    controller names a volumeClaimTemplates claim ``<template>-<pod>``."""
    is_dispatcher = pod["metadata"]["name"].startswith(builders.dispatcher_name(svc) + "-")
    return f"{JOURNAL_VOLUME}-{pod['metadata']['name']}" if is_dispatcher and svc.dispatcher.storage.enabled else None


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


def due(lost: Lost, svc: ServiceSpec, now: datetime) -> bool:
    """Whether ``lost`` has been unreachable for ``spec.nodeLoss.replaceAfterSeconds``."""
    return now >= lost.since + timedelta(seconds=svc.node_loss.replace_after_seconds)


def decide(svc: ServiceSpec, lost: Sequence[Lost], journal_local: bool, now: datetime) -> NodeLoss:
    """What to do with the service's pods on unreachable nodes.

    ``journal_local``: the dispatcher's journal claim is bound to a volume only its lost node can
    reach (read only for a dispatcher that is due; ignored otherwise).
    """
    replace: list[Replacement] = []
    waits: list[float] = []
    dispatcher: Finding | None = None
    workers: list[str] = []
    workers_reason = reasons.REPLACED_LOST_POD
    setting = svc.node_loss.replace_after_seconds
    for one in lost:
        is_dispatcher = one.name.startswith(builders.dispatcher_name(svc) + "-")
        lost_for = (now - one.since).total_seconds()
        where = f"its node {one.node} has been unreachable since {_format(one.since)}"
        if is_dispatcher and svc.node_loss.dispatcher == spec.NODE_LOSS_WAIT:
            dispatcher = Finding(reasons.DISPATCHER_NODE_LOST, _wait_message(one, where))
        elif not due(one, svc, now):
            at = _format(one.since + timedelta(seconds=setting))
            pending = f"pod {one.name}: {where}; it is replaced at {at} (spec.nodeLoss.replaceAfterSeconds {setting})"
            waits.append(max(0.5, setting - lost_for))
            if is_dispatcher:
                dispatcher = Finding(reasons.NODE_UNREACHABLE, pending)
            else:
                workers.append(pending)
                workers_reason = reasons.NODE_UNREACHABLE
        elif is_dispatcher:
            replace.append(_dispatcher_replacement(svc, one, where, setting, journal_local))
            # What the status says until the new pod changes it (the Event stays).
            dispatcher = Finding(replace[-1].reason, replace[-1].message)
        else:
            why = (f"Deleted pod {one.name} at once: {where} (over spec.nodeLoss.replaceAfterSeconds, {setting}); "
                   "its StatefulSet recreates it on another node")  # fmt: skip
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


def _wait_message(one: Lost, where: str) -> str:
    return (
        f"pod {one.name}: {where}, and spec.nodeLoss.dispatcher is Wait, so it is not replaced. "
        f"Bring the node back, or replace the pod yourself: `kubectl delete pod {one.name} --force "
        "--grace-period=0` once you know the node no longer runs it (a journal only that node holds needs "
        "its claim deleted first, which loses the running jobs), or set spec.nodeLoss.dispatcher to Recover."
    )


def _dispatcher_replacement(svc: ServiceSpec, one: Lost, where: str, setting: int, journal_local: bool) -> Replacement:
    head = f"Deleted the dispatcher pod {one.name} at once: {where} (over spec.nodeLoss.replaceAfterSeconds, {setting})"
    claim = journal_claim(svc, one.pod)
    if claim is not None and journal_local:
        return Replacement(
            one.pod,
            reasons.JOURNAL_LOST,
            f"{head}. Its journal claim {claim} was deleted too: its volume is reachable only from that node. The "
            "new dispatcher starts elsewhere on a fresh journal: the jobs that were running are lost, and clients "
            "must start new ones.",
            "Warning",
            claim,
        )
    if not svc.dispatcher.fault_tolerant_mode:
        return Replacement(
            one.pod,
            reasons.JOURNAL_LOST,
            f"{head}. Without faultTolerantMode it keeps no journal: the new dispatcher starts elsewhere with no "
            "jobs, so the jobs that were running are lost, and clients must start new ones.",
            "Warning",
        )
    return Replacement(
        one.pod,
        reasons.REPLACED_LOST_POD,
        f"{head}. The new dispatcher starts on another node and replays its journal, which other nodes reach: "
        "the running jobs go on.",
    )


def _format(when: datetime) -> str:
    return when.strftime(coretypes.TIME_FORMAT)
