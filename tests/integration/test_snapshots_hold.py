"""A scale-down waits while a snapshot is written: the hold and the workers' budget, for real.

As in test_drains_wait.py, the operator runs as a process and the dispatcher is a fake this test
serves on 127.0.0.1 (support.Pages): its /v1/signals says nobody reads, and its /v1/snapshots says
what the test sets. The dispatcher pod (Running on kwok's node) is given that address. The
StatefulSet the operator writes, the status, the Events and the PodDisruptionBudget are the real
API server's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tfdata_operator.plan import drain, hold
from tfdata_operator.wire.signals import SIGNALS_PATH
from tfdata_operator.wire.snapshots import SNAPSHOTS_PATH, SnapshotProgress, SnapshotsReport

from fixtures.support import (
    Kubectl,
    OperatorProcess,
    Pages,
    apply_on_fake_dispatcher,
    holds_for,
    service_signals,
    wait_for,
)

NAME = "saving"
PATH = "gs://bucket/tfdata/imagenet"
# A held change is looked at again every hold.SNAPSHOT_RECHECK_SECONDS, a budget every drain.RECHECK_SECONDS.
TIMEOUT = max(hold.SNAPSHOT_RECHECK_SECONDS, drain.RECHECK_SECONDS) + 30
# A hold is sampled over more than one recheck.
HOLD = hold.SNAPSHOT_RECHECK_SECONDS * 1.5


def snapshot(state: str) -> str:
    return SnapshotsReport((SnapshotProgress(PATH, state, journaled=True),), "snapshots named in the journal").to_json()


@pytest.fixture(scope="module")
def dispatcher() -> Iterator[Pages]:
    pages = Pages(
        {SIGNALS_PATH: service_signals(False, idle_seconds=60).to_json(), SNAPSHOTS_PATH: snapshot("IN_PROGRESS")}
    )
    yield pages
    pages.close()


@pytest.fixture(scope="module")
def service(kubectl: Kubectl, namespace: str, operator: OperatorProcess, dispatcher: Pages) -> Iterator[None]:
    spec = {"shardingPolicy": "DYNAMIC", "workers": {"replicas": 3}, "snapshots": {"directory": "gs://bucket/tfdata"}}
    apply_on_fake_dispatcher(kubectl, namespace, NAME, dispatcher, spec)
    yield


def observed(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    """The worker count the operator keeps, the budget, and status.held's message."""
    sts = kubectl.get("statefulset", f"{NAME}-worker", "-n", namespace) or {}
    pdb = kubectl.get("pdb", f"{NAME}-worker", "-n", namespace) or {}
    status = (kubectl.get("tfdata", NAME, "-n", namespace) or {}).get("status") or {}
    return {
        "workers": (sts.get("spec") or {}).get("replicas"),
        "budget": (pdb.get("spec") or {}).get("maxUnavailable"),
        "held": (status.get("held") or {}).get("message"),
        "drains": (status.get("drains") or {}).get("message"),
    }


def test_a_scale_down_and_drains_wait_while_a_snapshot_is_written(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, dispatcher: Pages, service: None
) -> None:
    def running() -> list[dict[str, Any]] | None:
        pods = kubectl.json("get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={NAME}")["items"]
        up = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        return up if len(up) == 4 else None

    pods = wait_for(running, 90, "the dispatcher and 3 workers Running on kwok's node")
    # Unreachable (kwok's pod address), with spec.snapshots: unknown counts as a snapshot being written.
    wait_for(lambda: observed(kubectl, namespace), TIMEOUT, "drains to wait while the snapshots are unknown",
             until=lambda seen: seen["budget"] == 0 and "snapshot" in (seen["drains"] or ""),
             show=operator.tail)  # fmt: skip

    name = next(p["metadata"]["name"] for p in pods if "dispatcher" in p["metadata"]["name"])
    ip = {"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}}
    kubectl.run("patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(ip))
    kubectl.run("patch", "tfdata", NAME, "-n", namespace, "--type=merge", "-p", '{"spec":{"workers":{"replicas":1}}}')

    seen = wait_for(lambda: observed(kubectl, namespace), TIMEOUT, "the scale-down to wait for the snapshot",
                    until=lambda s: PATH in (s["held"] or ""), show=operator.tail)  # fmt: skip
    assert seen["workers"] == 3 and seen["budget"] == 0, seen
    assert seen["held"].startswith(f"Scale-down 3→1 waits: snapshot {PATH} is being written"), seen
    assert any(SNAPSHOTS_PATH in r for r in dispatcher.requests), "the operator never read the fake's snapshots"
    # Held across more than one recheck, not only at the first: the workers and the budget stay.
    reads = sum(SNAPSHOTS_PATH in r for r in dispatcher.requests)
    holds_for(lambda: observed(kubectl, namespace), HOLD, "the scale-down held while the snapshot is written",
              ok=lambda s: s["workers"] == 3 and s["budget"] == 0 and PATH in (s["held"] or ""))  # fmt: skip
    assert sum(SNAPSHOTS_PATH in r for r in dispatcher.requests) > reads, "no recheck of the snapshots while held"

    dispatcher.pages[SNAPSHOTS_PATH] = snapshot("COMPLETED")
    seen = wait_for(lambda: observed(kubectl, namespace), TIMEOUT, "the scale-down once the snapshot completed",
                    until=lambda s: s["workers"] == 1 and s["budget"] == 1 and s["held"] is None,
                    show=operator.tail)  # fmt: skip
    events = kubectl.json("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={NAME}")["items"]
    reasons = {e["reason"] for e in events}
    assert {"RescaleHeld", "HeldChangeCarriedOut", "DrainsHeld", "DrainsAllowed"} <= reasons, reasons
    held = next(e["message"] for e in events if e["reason"] == "RescaleHeld")
    assert PATH in held
