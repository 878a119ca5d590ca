"""Why a StatefulSet of a TFDataService does not serve: from its pods and Events to (reason, message).

The ``DispatcherReady``/``WorkersReady`` conditions say "not ready"; this module says why,
with the reason Kubernetes itself gives (the StatefulSet controller's ``FailedCreate``, the
scheduler's ``Unschedulable``, the kubelet's ``CrashLoopBackOff`` or ``ImagePullBackOff``, the
volume controller's ``ProvisioningFailed``) and its message, so a user never has to go
looking. Pure: the reconcile loop (``controller/report.py``) reads the few Events it needs, only for
a StatefulSet that is not settled, and only where ``needs_events``/``claims_to_read`` ask; and,
when nothing here explains it, what the server of a running but unready pod says on its
``/readyz`` (``unready_server``, ``from_readiness``: "2 of 3 workers registered: waiting for every
listed worker to register").
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tfdata_operator.api import limits, reasons
from tfdata_operator.wire import serverconfig

Manifest = dict[str, Any]

# What a message quotes from Kubernetes is cut here: a condition should stay readable in `kubectl describe`.
MAX_QUOTED = 600
# Waiting reasons of a container that is on its way, not stuck.
_NORMAL_WAITING = frozenset({"ContainerCreating", "PodInitializing"})
# The StatefulSet controller's FailedCreate message: "create Pod x-0 in StatefulSet x failed error: <why>"
# (or "create Claim c for Pod x-0 in StatefulSet x failed error: <why>").
_FAILED_CREATE = re.compile(r"^create (Pod|Claim) (\S+) .*?failed error: (.*)$", re.DOTALL)
# The scheduler's words for a pod whose claim is not bound (VolumeBinding plugin).
_CLAIM_WORDS = ("unbound immediate PersistentVolumeClaims", "persistentvolumeclaim", "PersistentVolumeClaim")


@dataclass(frozen=True)
class Finding:
    """Why the StatefulSet does not serve: Kubernetes' own reason, and a message a user can act on."""

    reason: str
    message: str


def _quote(text: Any) -> str:
    """What a pod or Kubernetes says, on one clean line (a termination message may hold terminal escapes)."""
    return limits.clip(str(text or ""), MAX_QUOTED)


def _live_pods(sts: Manifest, pods: Sequence[Manifest]) -> list[Manifest]:
    """The StatefulSet's own pods (by owner uid, ordinal name), not being deleted, in ordinal order."""
    prefix, uid = sts["metadata"]["name"] + "-", sts["metadata"].get("uid")
    own = [
        p
        for p in pods
        if p["metadata"]["name"].startswith(prefix)
        and p["metadata"]["name"][len(prefix) :].isdigit()
        and not p["metadata"].get("deletionTimestamp")
        and (uid is None or any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or []))
    ]
    return sorted(own, key=lambda p: int(p["metadata"]["name"][len(prefix) :]))


def needs_events(sts: Manifest | None, pods: Sequence[Manifest]) -> bool:
    """Whether the StatefulSet's Events must be read: the controller has seen its current spec and
    still has fewer pods than replicas (it failed to create them: ``FailedCreate``)."""
    if not sts:
        return False
    status = sts.get("status") or {}
    observed = status.get("observedGeneration", 0) >= sts["metadata"].get("generation", 1)
    replicas = int((sts.get("spec") or {}).get("replicas", 1))
    return observed and int(status.get("replicas", 0)) < replicas and len(_live_pods(sts, pods)) < replicas


def _scheduling(pod: Manifest) -> Mapping[str, Any] | None:
    """The pod's PodScheduled condition when it is False."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return c  # type: ignore[no-any-return]
    return None


def _claims(sts: Manifest, pod: Manifest) -> list[str]:
    """The names of the pod's claims from the StatefulSet's volumeClaimTemplates (<template>-<pod>)."""
    templates = (sts.get("spec") or {}).get("volumeClaimTemplates") or []
    return [f"{t['metadata']['name']}-{pod['metadata']['name']}" for t in templates]


def claims_to_read(sts: Manifest | None, pods: Sequence[Manifest]) -> list[str]:
    """Claims whose Events say why they are not bound: those of pods the scheduler left pending
    because of their claims."""
    if not sts:
        return []
    names: list[str] = []
    for pod in _live_pods(sts, pods):
        cond = _scheduling(pod)
        if cond is not None and any(w in str(cond.get("message", "")) for w in _CLAIM_WORDS):
            names += _claims(sts, pod)
    return names


def _latest(events: Sequence[Manifest], of: frozenset[str] | None = None) -> Manifest | None:
    """The newest Warning Event (by when it was last seen), of the reasons ``of`` if given."""
    warnings = [e for e in events if e.get("type") == "Warning" and (of is None or e.get("reason") in of)]

    def seen(e: Manifest) -> str:
        series = e.get("series") or {}
        return str(series.get("lastObservedTime") or e.get("lastTimestamp") or e.get("eventTime") or "")

    return max(warnings, key=seen, default=None)


def _failed_create(sts: Manifest, events: Sequence[Manifest]) -> Finding | None:
    uid, sts_name = sts["metadata"].get("uid"), sts["metadata"]["name"]
    # Not those of an earlier StatefulSet of the same name (recreated when an immutable field changed).
    own = [e for e in events if uid is None or (e.get("involvedObject") or {}).get("uid") in (None, uid)]
    event = _latest(own, frozenset({reasons.FAILED_CREATE}))
    if event is None:
        return None
    text = str(event.get("message") or "")
    if m := _FAILED_CREATE.match(text):
        what, name, why = m.groups()
        return Finding(
            reasons.FAILED_CREATE, f"StatefulSet {sts_name} cannot create {what.lower()} {name}: {_quote(why)}"
        )
    return Finding(reasons.FAILED_CREATE, f"StatefulSet {sts_name} cannot create its pods: {_quote(text)}")


def _claim_pending(claims: Mapping[str, Sequence[Manifest]], scheduler_says: str) -> Finding | None:
    for claim, events in claims.items():
        if (event := _latest(events)) is not None:
            return Finding(
                str(event.get("reason") or reasons.CLAIM_PENDING),
                f"The claim {claim} is not bound: {_quote(event.get('message'))}",
            )
    if claims:
        return Finding(
            reasons.CLAIM_PENDING, f"The claim {next(iter(claims))} is not bound yet: {_quote(scheduler_says)}"
        )
    return None


def _more(count: int) -> str:
    return f" (and {count} more pod{'s' if count > 1 else ''})" if count else ""


def _unschedulable(pods: list[Manifest]) -> Finding | None:
    stuck = [(p, c) for p in pods if (c := _scheduling(p)) is not None]
    if not stuck:
        return None
    pod, cond = stuck[0]
    return Finding(
        str(cond.get("reason") or reasons.UNSCHEDULABLE),
        f"Pod {pod['metadata']['name']}{_more(len(stuck) - 1)} cannot be scheduled: {_quote(cond.get('message'))}",
    )


def _waiting(pods: list[Manifest]) -> Finding | None:
    """The first container that waits for a reason other than starting (CrashLoopBackOff, ImagePullBackOff, ...)."""
    found: list[tuple[Manifest, Manifest, Mapping[str, Any]]] = []
    for pod in pods:
        status = pod.get("status") or {}
        # An init container (the injected server program's) that cannot start blocks the rest.
        for c in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            waiting = (c.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") and waiting["reason"] not in _NORMAL_WAITING:
                found.append((pod, c, waiting))
                break
    if not found:
        return None
    pod, container, waiting = found[0]
    if unsupported := _unsupported_image(pod, container, waiting):
        return unsupported
    message = f"Pod {pod['metadata']['name']}{_more(len(found) - 1)}: container {container.get('name')} is in "
    message += str(waiting["reason"])
    if waiting.get("message"):
        message += f": {_quote(waiting['message'])}"
    last = (container.get("lastState") or {}).get("terminated") or {}
    if "exitCode" in last:
        message += f"; it last exited with code {last['exitCode']}"
        if last.get("reason"):
            message += f" ({last['reason']})"
        if last.get("message"):
            message += f": {_quote(last['message'])}"
    return Finding(str(waiting["reason"]), message)


_PYTHON = f"Python {'.'.join(map(str, serverconfig.OLDEST_PYTHON))}"
_TENSORFLOW = f"TensorFlow {'.'.join(map(str, serverconfig.OLDEST_TENSORFLOW))}"
# The container runtime's words for a command that is not in the image.
_NOT_FOUND = re.compile(r"executable file not found|no such file or directory", re.IGNORECASE)


def _unsupported_image(pod: Manifest, container: Mapping[str, Any], waiting: Mapping[str, Any]) -> Finding | None:
    """An image that cannot run the server program, said in words a user acts on."""
    last = (container.get("lastState") or {}).get("terminated") or {}
    where = f"Pod {pod['metadata']['name']}: container {container.get('name')} (image {container.get('image')})"
    if last.get("exitCode") == serverconfig.EXIT_UNSUPPORTED_IMAGE and last.get("message"):
        return Finding(reasons.UNSUPPORTED_IMAGE, f"{where} cannot serve: {_quote(last['message'])}")
    said = f"{waiting.get('message') or ''} {last.get('message') or ''}"
    if "python3" in said and _NOT_FOUND.search(said):
        return Finding(
            reasons.UNSUPPORTED_IMAGE,
            f"{where} has no python3 on its PATH: spec.image must have {_PYTHON} or newer and {_TENSORFLOW} "
            "or newer (or provide tfdata-server, with spec.serverProgram FromImage)",
        )
    return None


def explain(
    sts: Manifest | None,
    pods: Sequence[Manifest],
    events: Sequence[Manifest] = (),
    claims: Mapping[str, Sequence[Manifest]] | None = None,
) -> Finding | None:
    """Why the StatefulSet ``sts`` does not serve, or None when nothing explains it (pods starting,
    a server not ready yet). ``events`` are the StatefulSet's own, ``claims`` each claim's Events
    (both read only when ``needs_events``/``claims_to_read`` ask for them).

    The most fundamental cause comes first: pods that cannot be created, then claims that are not
    bound (they keep the pod from being scheduled), pods that cannot be scheduled, and containers
    that cannot start or keep crashing.
    """
    if not sts:
        return None
    live = _live_pods(sts, pods)
    if found := _failed_create(sts, events):
        return found
    unschedulable = _unschedulable(live)
    if claims and unschedulable is not None and (found := _claim_pending(claims, unschedulable.message)):
        return found
    return unschedulable or _waiting(live)


def unready_server(sts: Manifest | None, pods: Sequence[Manifest]) -> Manifest | None:
    """The first pod whose server runs (its container started) but is not ready, with an address to
    ask it why at: its ``/readyz`` says more than Kubernetes can."""
    if not sts:
        return None
    for pod in _live_pods(sts, pods):
        status = pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        running = any("running" in (c.get("state") or {}) for c in status.get("containerStatuses") or [])
        if running and not ready and status.get("podIP"):
            return pod
    return None


def from_readiness(pod: Manifest, detail: str) -> Finding:
    """A server's own readiness detail, as a finding (its probe answers "not ok: <phase>: <detail>")."""
    detail = detail.removeprefix("not ok:").strip()
    return Finding(reasons.SERVER_NOT_READY, f"Pod {pod['metadata']['name']} runs but is not ready: {_quote(detail)}")
