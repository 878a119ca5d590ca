"""The operator's own Prometheus metrics (``tfdata-operator run --metrics-port``).

Names start with ``tfdata_operator_``. Tests read them too: a "nothing changed" check proves
that a reconcile ran in its window by the reconcile counter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

RESULTS = ("idle", "changed", "invalid", "conflict", "refused", "error")
RECONCILES = Counter(
    "tfdata_operator_reconciles_total",
    "Reconciles of a TFDataService, by its namespace and name and the result: idle (nothing written), "
    "changed, invalid, conflict, refused (by another admission controller), error. A deleted service's series "
    "go with it.",
    ["namespace", "name", "result"],
)
RECONCILE_SECONDS = Histogram(
    "tfdata_operator_reconcile_duration_seconds",
    "How long one reconcile took, from leaving the queue to its last write.",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
QUEUE_DEPTH = Gauge("tfdata_operator_queue_depth", "TFDataServices waiting in the work queue.")
QUEUE_WAIT_SECONDS = Histogram(
    "tfdata_operator_queue_wait_seconds",
    "How long a TFDataService waited in the work queue before its reconcile started.",
    buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
API_REQUESTS = Counter(
    "tfdata_operator_api_requests_total",
    "Requests the reconcile loop sent to the API server (the watches are not counted), by verb and HTTP code.",
    ["verb", "code"],
)
SIGNAL_READS = Counter(
    "tfdata_operator_signal_reads_total",
    "GETs of a dispatcher's /v1/signals (the TFData autoscaler, a held change, a static service's disruption "
    "budget), by whether it answered with a signals document.",
    ["answered"],
)
SNAPSHOT_READS = Counter(
    "tfdata_operator_snapshot_reads_total",
    "GETs of a dispatcher's /v1/snapshots (a change that would take workers away, the disruption budget of a "
    "service with spec.snapshots), by whether it answered with a snapshots document.",
    ["answered"],
)
CHANGES = Counter(
    "tfdata_operator_changes_total",
    "Changes the operator made to children, by the reason of their Event (Created, Scaled, RollingOut, ...).",
    ["reason"],
)
SERVICES = Gauge(
    "tfdata_operator_services",
    "TFDataServices by the status of their Ready condition (True, False; Unknown before their first status).",
    ["ready"],
)
READY_STATES = ("True", "False", "Unknown")


def forget_service(namespace: str, name: str) -> None:
    """Drops a deleted service's reconcile counts: the series are as many as the services that exist."""
    for result in RESULTS:
        RECONCILES.remove(namespace, name, result)


def count_services(bodies: Iterable[Mapping[str, Any]]) -> None:
    """Sets ``SERVICES`` from the TFDataServices as the cache has them (at every resync)."""
    counts = dict.fromkeys(READY_STATES, 0)
    for body in bodies:
        conditions = (body.get("status") or {}).get("conditions") or []
        ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), "Unknown")
        counts[ready if ready in counts else "Unknown"] += 1
    for state, count in counts.items():
        SERVICES.labels(state).set(count)


LEADER = Gauge(
    "tfdata_operator_leader",
    "1 while this operator process reconciles: it holds the leader election's Lease, or runs without an election.",
)
