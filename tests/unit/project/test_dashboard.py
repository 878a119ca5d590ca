"""The chart's Grafana dashboard queries only metrics the code serves.

The served names are collected from the real collectors, not read from the source: the
operator's registry (``tfdata_operator.controller.metrics``), and the dispatcher's and a worker's
``/metrics`` collectors (``server.metrics.ServerCollector`` with the dispatcher's
``Aggregator``) fed with values, so that every series they can serve is present (a series
whose value is unknown is left out).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from prometheus_client.core import Metric

from tfdata_operator.controller import metrics
from tfdata_operator.server import probestate
from tfdata_operator.server.aggregate import Aggregator, WorkerReading
from tfdata_operator.server.metrics import CpuMeter, ServerCollector
from tfdata_operator.wire import signals
from tfdata_operator.wire.serverconfig import DispatcherServerConfig

from fixtures.fakes import Clock

DASHBOARD = Path(__file__).resolve().parents[3] / "charts" / "tfdata-operator" / "dashboards" / "tfdata-operator.json"
# Suffixes Prometheus adds to a family's name in its samples.
_SAMPLES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created")}


def sample_names(families: Iterable[Metric]) -> set[str]:
    names = set()
    for family in families:
        names |= {s.name for s in family.samples}
        # A labelled counter with no child yet has no sample; its name is still served once it counts.
        names |= {family.name + suffix for suffix in _SAMPLES.get(family.type, ("",))}
    return names


def running(stats: dict[str, float], clock: Clock) -> probestate.ProbeState:
    state = probestate.ProbeState("starting", clock=clock)
    state.apply(json.dumps({"phase": probestate.RUNNING, "ready": True, "detail": "serving", "stats": stats}))
    return state


def sampled_cpu(clock: Clock) -> CpuMeter:
    cpu = CpuMeter((1.0, "config"), clock=clock, read_child=lambda _: 0.0, read_own=lambda: clock.now / 2)
    cpu.sample()
    clock.now += 1
    cpu.sample()
    return cpu


def served() -> set[str]:
    """Every series name the operator, a dispatcher and a worker serve."""
    clock = Clock(100.0)
    worker = ServerCollector("worker", running({"tasks": 1}, clock), sampled_cpu(clock))
    readings = {"w0:8080": WorkerReading("w0:8080", tasks=1, cpu_utilization=0.5),
                "w1:8080": WorkerReading("w1:8080", error="refused")}  # fmt: skip
    config = DispatcherServerConfig(port=5050, health_port=8080, worker_health_port=8080,
                                    worker_addresses=("w0:8080", "w1:8080"))  # fmt: skip
    aggregator = Aggregator(config, lambda: 2.0, clock=clock, list_workers=lambda _: tuple(readings),
                            read=lambda address, _: readings[address])  # fmt: skip
    aggregator.poll_once()
    report = signals.ClientReport("trainer-0", 0.2, 5.0, 10).to_json().encode()
    assert aggregator.clients.receive(report).status == 204
    dispatcher = ServerCollector(
        "dispatcher", running({"workers_registered": 2}, clock), sampled_cpu(clock), aggregator.metrics
    )
    return sample_names(REGISTRY.collect()) | sample_names(worker.collect()) | sample_names(dispatcher.collect())


def queries(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if v.get("definition")]
    return exprs


def test_the_dashboard_is_valid_json_with_a_query_per_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels and all(p.get("targets") for p in panels)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_every_metric_the_dashboard_queries_is_served() -> None:
    names = served()
    queried = {m for expr in queries(json.loads(DASHBOARD.read_text())) for m in re.findall(r"\btfdata_[a-z_]+", expr)}
    missing = sorted(queried - names)
    assert not missing, f"the dashboard queries metrics nothing serves: {missing}"
    # It shows operator health and the servers' own series, as the chart's values promise.
    for family in ("tfdata_operator_", "tfdata_dispatcher_", "tfdata_worker_"):
        assert any(q.startswith(family) for q in queried), family


def test_the_check_would_notice_a_misspelt_name() -> None:
    names = served()
    assert "tfdata_operator_reconciles_total" in names and "tfdata_worker_cpu_seconds_total" in names
    assert "tfdata_operator_reconcile_total" not in names


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([{"type": "Ready", "status": "True"}], {"True": 1, "False": 0, "Unknown": 0}),
        ([{"type": "Ready", "status": "False"}], {"True": 0, "False": 1, "Unknown": 0}),
        ([], {"True": 0, "False": 0, "Unknown": 1}),
    ],
)
def test_services_are_counted_by_their_ready_condition(
    conditions: list[dict[str, str]], expected: dict[str, int]
) -> None:
    metrics.count_services([{"status": {"conditions": conditions}}])
    assert {s: REGISTRY.get_sample_value("tfdata_operator_services", {"ready": s}) for s in expected} == expected
