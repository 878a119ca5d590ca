"""The steps that decide, from what the dispatcher says, what the children are built with: the TFData
autoscaler's worker count (``spec.autoscaling``, ``status.autoscaling``), whether a change that would
break readers goes ahead (``spec.workers.rescalePolicy``, ``status.held``), and the workers'
disruption budget (``status.drains``).
"""

from __future__ import annotations

import copy
import dataclasses
from datetime import datetime, timezone

from tfdata_operator.api import coretypes, reasons, spec
from tfdata_operator.autoscaling import policy as autoscaler
from tfdata_operator.autoscaling import status as autoscalestatus
from tfdata_operator.controller.interface import Manifest
from tfdata_operator.controller.readers import Readers, for_hold, kept_signal, kept_snapshots, read_signals, retry_after
from tfdata_operator.controller.run import Run, later, no_sooner, sooner
from tfdata_operator.plan import drain, hold, scaling
from tfdata_operator.render import builders


def autoscale(run: Run) -> bool:
    """The TFData autoscaler's turn (``_autoscale``): the worker count the children are built with."""
    if run.readers is not None:
        run.svc, run.auto_status = _autoscale(run, run.readers)
    return True


def hold_changes(run: Run) -> bool:
    """Whether a change that would break readers (a static rescale, a suspend) goes ahead now, and
    whether a drain may take a worker (the workers' disruption budget)."""
    run.decision = _hold_decision(run)
    run.drains = _drain_decision(run)
    return True


def _autoscale(run: Run, readers: Readers) -> tuple[spec.ServiceSpec, Manifest | None]:
    """The TFData autoscaler's turn: read the dispatcher's signals when due, decide, and scale.

    Returns the spec to build the children from (with the new worker count) and the
    ``status.autoscaling`` block (None removes it: the service is not autoscaled on TFData).
    """
    svc, body, outcome = run.svc, run.body, run.outcome
    key = (svc.namespace, svc.name)
    old = (body.get("status") or {}).get("autoscaling")
    if svc.autoscaling is None or not builders.reads_signals(svc):
        readers.windows.forget(key)
        return svc, None
    if svc.suspend:
        return svc, old  # paused: no pods to read, and a resume starts from the count it left
    now = readers.clock()
    window = readers.windows.get(key)
    if not readers.windows.due(key, now):
        outcome.requeue_after = max(0.5, window.next_at - now)
        return svc, old
    if window.history == autoscaler.History() and not window.samples:
        window.history = autoscalestatus.history_from_status(old)  # a restarted operator
    fetched = read_signals(readers, run.dispatcher())
    decision = readers.windows.decide(key, autoscaler.Policy.of(svc.autoscaling), svc.workers.replicas, fetched, now)
    # A dispatcher not asked (backed off, or its namespace's reads at their cap) is asked when it may be.
    outcome.requeue_after = later(decision.next_check_seconds, retry_after(fetched))
    if decision.scales:
        scale = run.api.scale(svc.namespace, svc.name, decision.replicas)
        # The Scale's resourceVersion is the TFDataService's: the cache shows the new count at once.
        scaled = copy.deepcopy(body)
        scaled["spec"].setdefault("workers", {})["replicas"] = decision.replicas
        scaled["metadata"]["resourceVersion"] = scale["metadata"]["resourceVersion"]
        scaled.pop("status", None)
        outcome.written.append(scaled)
        run.record(reasons.SCALED, autoscalestatus.event_message(decision))
        svc = dataclasses.replace(svc, workers=dataclasses.replace(svc.workers, replicas=decision.replicas))
    return svc, autoscalestatus.build(old, decision, window, datetime.now(timezone.utc))


def _hold_decision(run: Run) -> hold.HoldDecision:
    """Whether a change that would break readers or take workers away goes ahead (``plan.hold``), from
    what the dispatcher says (``readers.for_hold``: the same ``/v1/signals`` answer the TFData
    autoscaler reads). A dispatcher not asked is asked again when it may be, not sooner."""
    svc, children = run.svc, run.children
    live_list = scaling.live_worker_list(builders.read_config(children.dispatcher))
    pending = hold.pending_change(svc, children.dispatcher, children.workers, live_list)
    running = hold.dispatcher_running(children.pods_of(builders.DISPATCHER))
    saves, signal = for_hold(run.readers, run.dispatcher(), pending, running)
    since = coretypes.parse_time(((run.body.get("status") or {}).get("held") or {}).get("since"))
    decision = hold.decide(svc, pending, running, signal, since, datetime.now(timezone.utc), saves)
    run.outcome.requeue_after = sooner(run.outcome.requeue_after, no_sooner(decision.requeue_after, saves, signal))
    return decision


def _drain_decision(run: Run) -> drain.DrainDecision:
    """The workers' disruption budget (``plan.drain``). The signal is read only when the budget depends
    on it (a static WhenIdle service whose dispatcher and workers run), and at most once per
    ``drain.valid_for`` of the last reading; the snapshots likewise (a service with spec.snapshots),
    at most once per ``drain.RECHECK_SECONDS`` (``readers.kept_signal``, ``kept_snapshots``)."""
    svc, children = run.svc, run.children
    running = hold.dispatcher_running(children.pods_of(builders.DISPATCHER))
    workers = len(children.pods_of(builders.WORKER))
    drains = (run.body.get("status") or {}).get("drains") or {}
    since, unreadable_since = (
        coretypes.parse_time(drains.get("since")),
        coretypes.parse_time(drains.get("unreadableSince")),
    )
    signal: hold.Signal | None = None
    if drain.needs_signal(svc, running, workers):
        signal, again = kept_signal(run.readers, run.dispatcher())
        run.outcome.requeue_after = sooner(run.outcome.requeue_after, again)
    saves: hold.Snapshots | None = None
    if drain.needs_snapshots(svc, running, workers):
        saves, again = kept_snapshots(run.readers, run.dispatcher())
        run.outcome.requeue_after = sooner(run.outcome.requeue_after, again)
    now = datetime.now(timezone.utc)
    decision = drain.decide(
        svc, running, workers, signal, since, now, saves, unreadable_since, run.config.drain_max_wait_seconds
    )
    requeue = decision.requeue_after
    if requeue is not None:
        requeue = later(requeue, retry_after(signal, saves))
    run.outcome.requeue_after = sooner(run.outcome.requeue_after, requeue)
    return decision
