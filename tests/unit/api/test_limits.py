"""Text from the pods and from Kubernetes in a status: cut to the CRD's bounds, one line, no control
characters (api/limits.py), so that the API server never refuses a status patch for it."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

import pytest

from tfdata_operator.api import limits
from tfdata_operator.autoscaling import status as autoscalestatus
from tfdata_operator.autoscaling.policy import History, ScaleDecision
from tfdata_operator.autoscaling.readings import ServiceWindow
from tfdata_operator.plan import nodeloss, status
from tfdata_operator.plan.diagnose import Finding
from tfdata_operator.render import builders
from tfdata_operator.render.builders import BuildSettings
from tfdata_operator.wire.serverinfo import GraphDefVersions, ServerInfo

from fixtures.cases import (
    CRD_PATH,
    SNAPSHOT_CRD_PATH,
    STALLED_SIGNALS,
    beyond_crd,
    body,
    crd_bounds,
    parse,
    status_schema,
)

NOW = datetime(2026, 11, 27, 12, 0, 0, tzinfo=timezone.utc)
STAMP = "2026-11-27T12:00:00Z"
# What a terminal would obey: colours, a window title, a cursor move; and NUL, BEL, DEL and a C1 CSI.
ESCAPES = "\x1b[31mred\x1b[0m \x1b]0;owned\x07title \x1b[2Jgone\x00\x07\x7f\x9b"
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def test_the_tables_are_the_crds_bounds_field_for_field() -> None:
    # A bound added to a CRD's status, or changed there, fails here until the operator fits to it.
    assert crd_bounds(status_schema(CRD_PATH)) == limits.SERVICE_STATUS
    assert crd_bounds(status_schema(SNAPSHOT_CRD_PATH)) == limits.SNAPSHOT_STATUS


@pytest.mark.parametrize(
    ("text", "limit", "clipped"),
    [
        ("Back-off\n  restarting\tfailed container\r\n", 100, "Back-off restarting failed container"),
        (ESCAPES, 100, "red title gone"),
        ("a\u202eevil\u2066b", 100, "a evil b"),  # bidirectional overrides read text backwards
        ("x" * 65, 64, "x" * 63 + "…"),
        ("word " * 20, 12, "word word w…"),
        ("2.17.0", 64, "2.17.0"),
    ],
)
def test_clip_keeps_one_clean_line_within_the_limit(text: str, limit: int, clipped: str) -> None:
    assert limits.clip(text, limit) == clipped
    assert len(clipped) <= limit and limits.clip(clipped, limit) == clipped


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def unready_workers(replicas: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "demo-worker"},
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas, "readyReplicas": 0, "currentRevision": "r1", "updateRevision": "r1"},
    }


def lost_workers(count: int) -> Finding:
    """What the status says of ``count`` workers on an unreachable node, not yet due for replacement."""
    pods = [
        {
            "metadata": {"name": f"demo-worker-{i}", "namespace": "ml", "uid": f"u{i}"},
            "spec": {"nodeName": "node-a"},
        }
        for i in range(count)
    ]
    node = {
        "metadata": {"name": "node-a"},
        "spec": {"taints": [{"key": nodeloss.UNREACHABLE_TAINT, "effect": "NoExecute", "timeAdded": STAMP}]},
        "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
    }
    decided = nodeloss.decide(parse(shardingPolicy="DYNAMIC"), nodeloss.lost_pods(pods, {"node-a": node}), None, NOW)
    assert decided.workers is not None
    return decided.workers


def extreme_status() -> dict[str, Any]:
    """A service's whole status when every pod says too much: a 10 KB TensorFlow version, 40
    preloads of 2 KB, a 64 KB readiness text full of escapes, 300 workers on a lost node, and a
    64 KB error from the dispatcher's signals."""
    svc = parse(shardingPolicy="DYNAMIC", workers={"replicas": 300})
    info = ServerInfo(
        tensorflow_version="2.17.0-" + "9" * 10_000,
        python_version="3.11\n" * 100,
        graph_def=GraphDefVersions(1882, 0, 0),
        preloaded=tuple(f"module_{i}_" + "m" * 2000 for i in range(40)),
        preloaded_ops=tuple("Op>" + "o" * 300 for _ in range(100)),
    )
    servers = status.Servers(
        dispatcher={"metadata": {"name": "demo-dispatcher"}, "spec": {"replicas": 1}, "status": {}},
        workers=unready_workers(300),
        dispatcher_problem=Finding("NotReady", "readyz: " + ESCAPES * 4_000),
        workers_problem=lost_workers(300),
        server_info=info,
        server_pod="demo-dispatcher-0/" + "u" * 300,
    )
    built = status.compute_status(svc, body(), servers, BuildSettings(), STAMP)
    error = "GET http://10.0.0.1:8081/v1/signals: 200 " + "reason phrase\r\n" * 4_400
    window = ServiceWindow(latest=STALLED_SIGNALS, last_error=error)
    decision = ScaleDecision(300, 300, f"the trainers are fed; the last read failed: {error}", 5.0, History())
    built["autoscaling"] = autoscalestatus.build(None, decision, window, NOW)
    return built


def test_a_status_from_pods_that_say_too_much_fits_the_crd_on_clean_lines() -> None:
    built = extreme_status()
    assert beyond_crd(built, status_schema(CRD_PATH)) == []
    assert [s for s in strings(built) if CONTROL.search(s)] == []
    ready = next(c for c in built["conditions"] if c["type"] == "Ready")
    assert ready["message"].startswith("The dispatcher is not ready: readyz: red title gone red title gone")
    assert ready["message"].endswith("gone…")
    workers = next(c for c in built["conditions"] if c["type"] == "WorkersReady")
    assert workers["message"].startswith("0/300 workers are ready and up to date: pod demo-worker-0: its node node-a")
    assert workers["message"].endswith("…")
    assert built["server"]["tensorflowVersion"] == "2.17.0-" + "9" * 56 + "…"
    assert built["server"]["pythonVersion"].startswith("3.11 3.11 ")
    assert len(built["server"]["preloaded"]) == 32
    assert len(built["autoscaling"]["signals"]["error"]) == 1024


def test_a_status_cut_to_the_crd_is_written_once_then_left_alone() -> None:
    built = extreme_status()
    stored = {**body(), "status": built}
    svc = parse(shardingPolicy="DYNAMIC", workers={"replicas": 300})
    again = extreme_status()
    assert not status.status_differs(built, again)
    # status.server is kept from what is stored when the reconcile reads no /serverinfo.
    kept = status.compute_status(
        svc,
        stored,
        status.Servers(
            dispatcher={"metadata": {"name": builders.dispatcher_name(svc)}, "spec": {"replicas": 1}, "status": {}},
            workers=unready_workers(300),
            dispatcher_problem=Finding("NotReady", "readyz: " + ESCAPES * 4_000),
            workers_problem=lost_workers(300),
        ),
        BuildSettings(),
        STAMP,
    )
    assert not status.status_differs(built, kept)
    # The autoscaler's block with the same long error is the one stored: no rewrite every 30 s.
    window = ServiceWindow(latest=STALLED_SIGNALS, last_error="x\n" * 40_000)
    hold = ScaleDecision(300, 300, "the trainers are fed; the last read failed: " + "x\n" * 40_000, 5.0, History())
    first = autoscalestatus.build(None, hold, window, NOW)
    later = datetime(2026, 11, 27, 12, 5, 0, tzinfo=timezone.utc)
    assert autoscalestatus.build(first, hold, window, later) == first
