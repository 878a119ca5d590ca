"""A queued TFDataService's turn with Kueue (``plan/kueue.py`` decides): its Workload written,
deleted or its status patched, and the spec the children are built with (suspended until
admitted, then with the admission's flavors and at most its worker count).

Without ``--kueue`` the operator watches no Workload: a service labelled for a queue runs no pod
and says how to turn Kueue on.
"""

from __future__ import annotations

import logging

from kubernetes.client.exceptions import ApiException

from tfdata_operator.api import kueue, limits, reasons
from tfdata_operator.controller.interface import REFUSALS, Manifest
from tfdata_operator.controller.kube import describe_api_error
from tfdata_operator.controller.run import Run, read_kept, sooner
from tfdata_operator.plan import children as kinds
from tfdata_operator.plan import desired as plan
from tfdata_operator.plan import kueue as queueing
from tfdata_operator.render import builders

log = logging.getLogger(__name__)

# A Workload whose status patch was refused as stale (409) is looked at again this soon.
CONFLICT_RETRY_SECONDS = 1.0
NOT_ENABLED = (
    f"This service asks to be admitted through Kueue (label {kueue.QUEUE_LABEL}), but the operator runs "
    "without Kueue: no pod runs. Install the chart with kueue.enabled=true (the operator's --kueue), or "
    "remove the label (docs/training-runs.md)."
)


def follow_kueue(run: Run) -> bool:
    """Kueue's turn: decide (``plan.kueue.decide``) and carry it out; ``run.svc`` becomes the spec the
    children are built with."""
    svc, uid = run.svc, run.body["metadata"]["uid"]
    live = next((w for w in run.observed.workloads if plan.owned_by(w, uid)), None)
    old = (run.body.get("status") or {}).get("kueue")
    if svc.kueue is None and live is None:
        run.kueue = queueing.Decision()
        return True
    if svc.kueue is not None and not run.config.kueue:
        run.kueue = _not_enabled(run, old)
        run.svc = run.kueue.effective_spec(svc)
        return True
    desired, problem = None, None
    if svc.kueue is not None:
        priority, problem = _priority(run)
        desired = builders.render_workload(svc, run.config.build, priority)
    decision = queueing.decide(
        svc,
        desired,
        live,
        pods=len(run.children.pods),
        ready=_ready(run),
        flavors=_flavors(run, live),
        old=old,
        now=run.now,
        problem=problem,
    )
    decision = _carry_out(run, decision, live)
    run.kueue = decision
    run.svc = decision.effective_spec(svc)
    return True


def _carry_out(run: Run, decision: queueing.Decision, live: Manifest | None) -> queueing.Decision:
    """The Workload's writes; a write Kueue or the API server refuses is said in the status and
    tried again with back-off."""
    svc, api = run.svc, run.api
    for event_type, reason, message in decision.events:
        run.record(reason, message, event_type)
    try:
        if decision.delete and live is not None:
            api.delete(kinds.WORKLOAD.api_version, kinds.WORKLOAD.kind, svc.namespace, _name(live), uid=decision.delete)
            log.info("%s/%s: deleted Kueue Workload %s", svc.namespace, svc.name, _name(live))
        if decision.apply is not None:
            run.outcome.written.append(api.apply(decision.apply))
        if decision.status_patch is not None and live is not None:
            written = api.patch_subresource(
                kinds.WORKLOAD.api_version,
                kinds.WORKLOAD.kind,
                svc.namespace,
                _name(live),
                "status",
                decision.status_patch,
            )
            run.outcome.written.append(written)
    except ApiException as exc:
        if exc.status == 409:
            # The Workload changed since the watch delivered it: decide again from the new one.
            run.outcome.requeue_after = sooner(run.outcome.requeue_after, CONFLICT_RETRY_SECONDS)
            return decision
        if exc.status not in (*REFUSALS, 404):
            raise
        message = f"The API server refused the service's Kueue Workload: {describe_api_error(exc)}" + _hint(exc)
        run.outcome.retry = True
        return _unavailable(run, message, (run.body.get("status") or {}).get("kueue"), dict(decision.status or {}))
    return decision


def _hint(exc: ApiException) -> str:
    if exc.status == 404:
        return f" (is Kueue installed? The API server serves no {kinds.WORKLOAD.api_version} Workloads)"
    if exc.status == 403:
        return " (the operator needs the chart's kueue.enabled permissions)"
    return ""


def _not_enabled(run: Run, old: Manifest | None) -> queueing.Decision:
    assert run.svc.kueue is not None
    return _unavailable(run, NOT_ENABLED, old, {"queue": run.svc.kueue.queue})


def _unavailable(run: Run, message: str, old: Manifest | None, status: Manifest) -> queueing.Decision:
    """No pod may run, for a reason of the operator's or the cluster's (a suspended service stays so)."""
    state = queueing.SUSPENDED if run.svc.suspend else queueing.UNAVAILABLE
    if state == queueing.UNAVAILABLE and (old or {}).get("state") != state:
        run.record(reasons.KUEUE_UNAVAILABLE, limits.clip(message, limits.EVENT_MESSAGE), "Warning")
    status = {**status, "state": state, "message": message}
    return queueing.Decision(state=state, message=message, status=status)


def _priority(run: Run) -> tuple[int | None, str | None]:
    """The value of the service's WorkloadPriorityClass (None: it names none), or why it cannot be read."""
    assert run.svc.kueue is not None
    name = run.svc.kueue.priority_class
    if name is None:
        return None, None
    kind = kinds.PRIORITY_CLASS
    try:
        found = read_kept(run.api, run.readers, kind.api_version, kind.kind, None, name)
    except ApiException as exc:
        if exc.status not in REFUSALS:
            raise
        return (
            None,
            f"WorkloadPriorityClass {name} (label {kueue.PRIORITY_LABEL}) cannot be read: {describe_api_error(exc)}",
        )
    value = (found or {}).get("value")
    if found is None or not isinstance(value, int):
        return (
            None,
            f"WorkloadPriorityClass {name} (label {kueue.PRIORITY_LABEL}) does not exist: create it, or fix the label.",
        )
    return value, None


def _named(priority_class: str) -> str:
    return f"WorkloadPriorityClass {priority_class} (label {kueue.PRIORITY_LABEL})"


def _flavors(run: Run, live: Manifest | None) -> dict[str, Manifest | None]:
    """The ResourceFlavors the Workload was admitted with, by name (None: not found or not readable)."""
    found: dict[str, Manifest | None] = {}
    kind = kinds.FLAVOR
    for name in {f for names in queueing.flavors_of(live).values() for f in names}:
        try:
            found[name] = read_kept(run.api, run.readers, kind.api_version, kind.kind, None, name)
        except ApiException as exc:
            if exc.status not in REFUSALS:
                raise
            found[name] = None
    return found


def _ready(run: Run) -> bool:
    """Whether the dispatcher and every worker the StatefulSet runs are Ready (Kueue's PodsReady)."""
    dispatcher, workers = run.children.dispatcher, run.children.workers
    if dispatcher is None or workers is None:
        return False

    def settled(sts: Manifest) -> bool:
        want = int((sts.get("spec") or {}).get("replicas", 0))
        return want > 0 and int((sts.get("status") or {}).get("readyReplicas", 0)) >= want

    return settled(dispatcher) and (settled(workers) or int((workers.get("spec") or {}).get("replicas", 0)) == 0)


def _name(workload: Manifest) -> str:
    return str(workload["metadata"]["name"])
