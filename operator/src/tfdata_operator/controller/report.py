"""The last steps, that tell: the Events of a held change, a suspend and a resume, and the status
recomputed from the children as they are now, with why a StatefulSet does not serve
(``plan.diagnose``) and what the dispatcher runs (``status.server``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tfdata_operator.api import limits, reasons
from tfdata_operator.controller import cache
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.interface import Api, Manifest
from tfdata_operator.controller.readers import Readers, readiness, server_info
from tfdata_operator.controller.run import Run, sooner
from tfdata_operator.plan import hold, scaling, status
from tfdata_operator.plan import kueue as queueing
from tfdata_operator.plan.diagnose import Finding, claims_to_read, explain, from_readiness, needs_events, unready_server
from tfdata_operator.render import builders


def announce_hold(run: Run) -> bool:
    """An Event when a change starts to wait, when a waiting one is carried out, and on suspend and resume."""
    was_held = bool((run.body.get("status") or {}).get("held"))
    decision, pending = run.decision, run.decision.pending
    if decision.action == hold.HOLD and pending is not None and not was_held:
        run.record(reasons.SUSPEND_HELD if pending.is_suspend else reasons.RESCALE_HELD, decision.message)
    elif decision.action == hold.FORCE:
        run.record(reasons.HELD_CHANGE_FORCED, decision.message, "Warning")
    elif decision.action == hold.PROCEED and pending is not None and was_held:
        run.record(reasons.HELD_CHANGE_CARRIED_OUT, decision.message)
    if decision.action != hold.HOLD and pending is not None and pending.is_suspend:
        message = "Suspending: every pod of the service stops; its Services, address and journal claim stay."
        run.api.event(run.body, "Normal", reasons.SUSPENDING, message)
    elif not run.svc.suspend and scaling.suspended(run.children.dispatcher):
        message = "Resuming: the dispatcher and workers start again at the same address."
        run.api.event(run.body, "Normal", reasons.RESUMING, message)
    return True


def report_status(run: Run) -> bool:
    """The status, recomputed from the children as they are now (and why they do not serve, if they do not)."""
    if run.outcome.written:
        run.outcome.result = "changed"
    svc, children, readers = run.svc, run.children, run.readers
    dispatcher_sts = run.live.get(("StatefulSet", builders.dispatcher_name(svc)))
    workers_sts = run.live.get(("StatefulSet", builders.workers_name(svc)))
    servers = status.Servers(
        dispatcher=dispatcher_sts,
        workers=workers_sts,
        dispatcher_problem=run.node_loss.dispatcher
        or _explain(
            run.api,
            run.config,
            dispatcher_sts,
            children.pods_of(builders.DISPATCHER),
            svc.dispatcher.health_port,
            readers,
        ),
        workers_problem=run.node_loss.workers
        or _explain(
            run.api, run.config, workers_sts, children.pods_of(builders.WORKER), svc.workers.health_port, readers
        ),
        **_server_info(run),
    )
    queued = None
    if run.kueue.gated:
        # Not the user's suspend: the spec says run, Kueue says not yet.
        svc = dataclasses.replace(svc, suspend=False)
        queued = status.Condition(
            reasons.READY, False, queueing.REASONS.get(run.kueue.state or "", reasons.KUEUE_QUEUED), run.kueue.message
        )
    new_status = status.compute_status(
        svc,
        run.body,
        servers,
        run.config.build,
        run.now,
        waiting=run.desired.waiting,
        decision=run.decision,
        drains=run.drains,
        queued=queued,
    )
    new_status["autoscaling"] = run.auto_status
    new_status["lifecycle"] = run.lifecycle_status
    new_status["kueue"] = limits.fit(run.kueue.status, limits.SERVICE_STATUS, "kueue")
    run.report.write(new_status)
    return True


def _server_info(run: Run) -> dict[str, Any]:
    """What the ready dispatcher pod runs, when it is known and not yet in the status (``readers.server_info``)."""
    if run.readers is None:
        return {}
    reported = ((run.body.get("status") or {}).get("server") or {}).get("pod")
    found, again = server_info(
        run.readers, run.children.pods_of(builders.DISPATCHER), reported, run.svc.dispatcher.health_port
    )
    run.outcome.requeue_after = sooner(run.outcome.requeue_after, again)
    return found


def _explain(
    api: Api,
    config: OperatorConfig,
    sts: Manifest | None,
    pods: list[Manifest],
    health_port: int,
    readers: Readers | None,
) -> Finding | None:
    """Why a StatefulSet does not serve (``diagnose.py``): nothing is read for one that is settled,
    Events only for pods it could not create or claims that are not bound, and one server's
    ``/readyz`` only when its pod runs but is not ready and nothing else explains it.

    Events are read for a whole namespace and kind at once (``Api.list_events``), and each read is
    kept for a resync (``readers``): every event of an unready service's pods queues a reconcile,
    and each would otherwise read again what it read a moment ago. So unready services cost at most
    one list of Events per namespace and kind (StatefulSet, PersistentVolumeClaim) per resync, and
    one ``/readyz`` per unready server; the status written from them changes only when their answer
    does."""
    if sts is None or scaling.statefulset_settled(sts):
        return None
    namespace, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
    ttl, now = config.resync_seconds, readers.clock() if readers is not None else 0.0

    def events(kind: str, involved: str) -> list[Manifest]:
        def read() -> list[Manifest]:
            return [cache.trim_event(e) for e in api.list_events(namespace, kind)]

        listed = read() if readers is None else readers.events.get((namespace, kind), read, now, ttl)
        return [e for e in listed if e["involvedObject"].get("name") == involved]

    sts_events = events("StatefulSet", name) if needs_events(sts, pods) else []
    claims = {c: events("PersistentVolumeClaim", c) for c in claims_to_read(sts, pods)}
    found = explain(sts, pods, sts_events, claims)
    if found is None and readers is not None and (pod := unready_server(sts, pods)) is not None:
        detail = readiness(readers, pod, health_port, ttl)
        found = from_readiness(pod, detail) if detail else None
    return found
