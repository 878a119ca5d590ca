"""``spec.lifecycle`` and ``status.lifecycle``: the workload read by name and, when the idle rule is
due, the dispatcher's signal; then the service tied to its workload, and suspended or deleted when a
rule says so (``plan.lifecycle`` decides).
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime, timezone

from kubernetes.client.exceptions import ApiException

from tfdata_operator.api import limits, reasons, spec
from tfdata_operator.api.identity import API_VERSION, KIND
from tfdata_operator.controller.interface import REFUSALS, Manifest
from tfdata_operator.controller.kube import describe_api_error
from tfdata_operator.controller.readers import read_signals
from tfdata_operator.controller.run import Run, no_sooner, read_kept, sooner
from tfdata_operator.plan import children as kinds
from tfdata_operator.plan import hold, lifecycle
from tfdata_operator.render import builders
from tfdata_operator.wire.signals import ServiceSignals

log = logging.getLogger(__name__)


def follow_lifecycle(run: Run) -> bool:
    """``spec.lifecycle`` (``plan.lifecycle``): the workload read by name, the dispatcher's signal
    read when the idle rule is due; then the service tied to its workload (ownerReferences), and
    suspended (in this same reconcile) or deleted when a rule says so."""
    svc, meta, api = run.svc, run.body["metadata"], run.api
    old = (run.body.get("status") or {}).get("lifecycle")
    ref = svc.lifecycle.workload
    workload: Manifest | lifecycle.Unreadable | None = None
    if ref is not None:
        try:
            # Kept NODE_READ_SECONDS: a burst of the service's events costs one read.
            workload = read_kept(api, run.readers, ref.api_version, ref.kind, svc.namespace, ref.name)
        except ApiException as exc:
            if exc.status not in REFUSALS:
                raise
            workload = lifecycle.Unreadable(describe_api_error(exc) + _grant_hint(ref, exc))
    now = datetime.now(timezone.utc)
    signal: ServiceSignals | str | None = None
    running = hold.dispatcher_running(run.children.pods_of(builders.DISPATCHER))
    if lifecycle.needs_signal(svc, running, old, now):
        signal = read_signals(run.readers, run.dispatcher())
    decision = lifecycle.decide(svc, workload, meta.get("ownerReferences") or [], old, signal, now)
    run.lifecycle_status = limits.fit(decision.status, limits.SERVICE_STATUS, "lifecycle")
    run.outcome.requeue_after = sooner(run.outcome.requeue_after, no_sooner(decision.requeue_after, signal))
    if decision.owner_references is not None:
        patch = {"metadata": {"ownerReferences": decision.owner_references, "resourceVersion": meta["resourceVersion"]}}
        written = api.patch(API_VERSION, KIND, svc.namespace, svc.name, patch)
        run.outcome.written.append(written)
        meta["resourceVersion"] = written["metadata"]["resourceVersion"]
        tied = any(
            r.get("uid") == (decision.status or {}).get("workload", {}).get("uid") for r in decision.owner_references
        )
        what = f"{ref.kind} {ref.name}" if ref is not None else "its former workload"
        log.info("%s/%s: %s", svc.namespace, svc.name, f"{'Tied to' if tied else 'Untied from'} {what}")
    for event_type, reason, message in decision.events:
        if reason in (reasons.LIFECYCLE_SUSPEND, reasons.LIFECYCLE_DELETE):
            run.record(reason, message, event_type)
        else:
            log.info("%s/%s: %s", svc.namespace, svc.name, message)
            api.event(run.body, event_type, reason, message)
    if decision.action == spec.LIFECYCLE_DELETE:
        # The status first: were the delete to fail, the next reconcile must not find it undone.
        run.report.write({"lifecycle": run.lifecycle_status})
        api.delete(API_VERSION, KIND, svc.namespace, svc.name, uid=meta["uid"])
        run.outcome.result = "changed"
        return False
    if decision.action == spec.LIFECYCLE_SUSPEND:
        written = api.patch(API_VERSION, KIND, svc.namespace, svc.name, {"spec": {"suspend": True}})
        run.outcome.written.append(written)
        meta["resourceVersion"] = written["metadata"]["resourceVersion"]
        run.svc = dataclasses.replace(svc, suspend=True)
    return True


def _grant_hint(ref: spec.WorkloadRef, exc: ApiException) -> str:
    if exc.status != 403:
        return ""
    group = ref.api_version.rpartition("/")[0] or '""'
    return (
        f" (grant the operator get on {kinds.plural_of(ref.kind)} in API group {group}: "
        "the chart's lifecycle.workloadKinds, docs/training-runs.md)"
    )
