"""``status.autoscaling`` and the scale Event, for ``spec.autoscaling.metric: TFData``.

What a person reads to see why the workers are as many as they are: the last decision (desired
replicas and its reason), the signals it was made from, and the last scale. Pure: the caller
passes the decision, the service's window (``signalsource.ServiceWindow``) and the time.

The readings change at every check (a worker at 95% CPU, then 94%), and every change would be
a status write: the block is rewritten only when the count changes, or when what it says
changed and the block is at least ``REFRESH_SECONDS`` old. A steady service (at minReplicas,
nobody reading) writes nothing. Absent values are None, so that a merge patch removes them;
compare with ``differs``, which takes None for absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from tfdata_operator.api import diff, limits
from tfdata_operator.autoscaling.policy import History, LastScale, ScaleDecision
from tfdata_operator.autoscaling.readings import ServiceWindow
from tfdata_operator.wire.signals import JobReading

# The Event's reason for every scale the autoscaler makes.
REFRESH_SECONDS = 30.0


def event_message(decision: ScaleDecision) -> str:
    """``Scaled workers from 2 to 4: trainers waited on data 38% of the time, workers at 95% CPU``."""
    return f"Scaled workers from {decision.current} to {decision.replicas}: {decision.reason}"


def build(
    old: Mapping[str, Any] | None, decision: ScaleDecision, window: ServiceWindow, now: datetime
) -> dict[str, Any]:
    """The whole ``status.autoscaling`` block after ``decision``; ``old`` is the one stored now."""
    old = old or {}
    last_scale = old.get("lastScale")
    if decision.scales:
        last_scale = {
            "time": _timestamp(now),
            "fromReplicas": decision.current,
            "toReplicas": decision.replicas,
            "reason": decision.reason,
        }
    fresh = {
        "metric": "TFData",
        "desiredReplicas": decision.replicas,
        "reason": decision.reason,
        "signals": _signals(window),
        "lastScale": last_scale,
        "observedTime": _timestamp(now),
    }
    # The signals' error is the dispatcher's text: fit to the CRD before it is compared with what is stored.
    fresh = limits.fit(fresh, limits.SERVICE_STATUS, "autoscaling")
    if not old or old.get("desiredReplicas") != decision.replicas or decision.scales:
        return fresh
    unchanged = not diff.changes({**old, "observedTime": None}, {**fresh, "observedTime": None}, removes=True)
    if unchanged or _age(old.get("observedTime"), now) < REFRESH_SECONDS:
        return dict(old)
    return fresh


def history_from_status(block: Mapping[str, Any] | None) -> History:
    """What a restarted operator knows of the last scale, from the status it wrote before."""
    last = (block or {}).get("lastScale")
    if not isinstance(last, Mapping):
        return History()
    try:
        at = _parse(str(last["time"])).timestamp()
        return History(LastScale(at, int(last["fromReplicas"]), int(last["toReplicas"])))
    except (KeyError, TypeError, ValueError):
        return History()  # written by another version, or edited: start afresh


def _signals(window: ServiceWindow) -> dict[str, Any]:
    """The last reading, in the units people read (whole percents); idle time is left out: it
    changes at every check and the reason already says it where it matters."""
    s = window.latest
    return {
        "reading": None if s is None else s.reading,
        "dataStallPercent": None if s is None or not s.reporting_clients else _percent(s.client_stall_fraction_mean),
        "workerCPUPercent": None if s is None else _percent(s.worker_cpu_utilization_mean),
        "reportingClients": None if s is None else s.reporting_clients,
        "elementsPerSecond": None if s is None or not s.reporting_clients else _rate(s.client_elements_per_second),
        "workersAnswering": None if s is None else s.workers_answering,
        "jobs": None if s is None or s.jobs is None else [_job(j) for j in s.jobs],
        "jobsNotListed": s.jobs_not_listed if s is not None and s.jobs_not_listed else None,
        "jobsNote": OLD_DISPATCHER_JOBS if s is not None and s.jobs is None else None,
        "error": window.last_error,
    }


# A dispatcher whose /v1/signals has no ``jobs`` (its server program is older than the field).
OLD_DISPATCHER_JOBS = (
    "the dispatcher does not list its jobs (its server program is older than this operator): "
    "update spec.image to list them; the totals above still hold"
)


def _job(job: JobReading) -> dict[str, Any]:
    """One job's trainers, without absent keys (a list's items are written whole, and null is
    not a value their fields take). The name comes from the trainers' reports: ``fit`` clips it."""
    item = {
        "name": job.job_name,
        "trainers": job.reporting_clients,
        "clients": job.attached_clients,
        "dataStallPercent": _percent(job.client_stall_fraction_mean),
        "maxDataStallPercent": _percent(job.client_stall_fraction_max),
    }
    return {key: value for key, value in item.items() if value is not None}


def _rate(per_second: float | None) -> float | None:
    return None if per_second is None else round(per_second, 1)


def _percent(fraction: float | None) -> int | None:
    return None if fraction is None else round(fraction * 100)


def _timestamp(now: datetime) -> str:
    return now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _age(stamp: Any, now: datetime) -> float:
    try:
        return (now - _parse(str(stamp))).total_seconds()
    except ValueError:
        return float("inf")
