"""A drain waits while a client reads a static service: the workers' PodDisruptionBudget, for real.

The operator runs as a process; the dispatcher's /v1/signals is a fake this test serves on
127.0.0.1 (support.Pages), and the dispatcher pod (Running on kwok's node) is given that address:
its status's podIP is patched to 127.0.0.1 and its health port is the fake's, so the operator
reads the test's answer exactly where it reads a real dispatcher's. The real disruption controller
computes the budget's disruptionsAllowed, and the API server's eviction endpoint (what `kubectl
drain` calls) refuses a worker with 429 while the budget is 0 and evicts it once it is 1.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tfdata_operator.plan import drain
from tfdata_operator.wire.signals import SIGNALS_PATH

from fixtures.support import Kubectl, OperatorProcess, Pages, apply_on_fake_dispatcher, service_signals, wait_for

NAME = "drains"
# The operator reads the signal of a static service every drain.RECHECK_SECONDS; the budget then
# changes in one reconcile, and the disruption controller follows at once.
FLIP_TIMEOUT = drain.RECHECK_SECONDS + 30


def idle() -> str:
    return service_signals(False, idle_seconds=60).to_json()


def reading() -> str:
    return service_signals(True).to_json()


@pytest.fixture(scope="module")
def dispatcher_signals() -> Iterator[Pages]:
    pages = Pages({SIGNALS_PATH: idle()})
    yield pages
    pages.close()


@pytest.fixture(scope="module")
def service(kubectl: Kubectl, namespace: str, operator: OperatorProcess, dispatcher_signals: Pages) -> Iterator[None]:
    spec = {"shardingPolicy": "FILE", "workers": {"replicas": 2}}
    apply_on_fake_dispatcher(kubectl, namespace, NAME, dispatcher_signals, spec)
    yield


def pdb(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    return kubectl.get("pdb", f"{NAME}-worker", "-n", namespace) or {}


def budget(kubectl: Kubectl, namespace: str) -> tuple[Any, Any]:
    """The budget the operator wrote, and the disruptions the disruption controller allows for it now."""
    found = pdb(kubectl, namespace)
    return (found.get("spec") or {}).get("maxUnavailable"), (found.get("status") or {}).get("disruptionsAllowed")


def evict(kubectl: Kubectl, namespace: str, pod: str) -> tuple[int, str]:
    """POST pods/<pod>/eviction, as `kubectl drain` does: its exit code and what the API server said."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction"
    result = kubectl.run("create", "--raw", path, "-f", "-", input=json.dumps(body), check=False)
    return result.returncode, result.stdout + result.stderr


def running_pods(kubectl: Kubectl, namespace: str, component: str) -> list[dict[str, Any]]:
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/component={component}")["items"]
    return [
        p
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


def test_a_drain_waits_while_a_client_reads_a_static_service(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, dispatcher_signals: Pages, service: None
) -> None:
    def pods() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        dispatchers, workers = (
            running_pods(kubectl, namespace, "dispatcher"),
            running_pods(kubectl, namespace, "worker"),
        )
        return (dispatchers, workers) if len(dispatchers) == 1 and len(workers) == 2 else None

    dispatchers, workers = wait_for(pods, 90, "the dispatcher and 2 workers Running on kwok's node")
    dispatcher = dispatchers[0]["metadata"]["name"]
    # The operator cannot reach kwok's pod addresses: whether a client reads is unknown, which counts as reading.
    wait_for(lambda: budget(kubectl, namespace), FLIP_TIMEOUT, "drains to wait while the signal is unknown",
             until=lambda seen: seen == (0, 0), show=lambda: (pdb(kubectl, namespace), operator.tail()))  # fmt: skip
    unknown = (kubectl.get("tfdata", NAME, "-n", namespace) or {})["status"]["drains"]
    assert "is unknown" in unknown["message"] and unknown["maxUnavailable"] == 0

    # The dispatcher pod answers at the fake's address now; nobody reads: one worker at a time may go.
    ip = {"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}}
    kubectl.run(
        "patch", "pod", dispatcher, "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(ip)
    )
    reads = len(dispatcher_signals.requests)
    wait_for(lambda: budget(kubectl, namespace), FLIP_TIMEOUT, "drains to go ahead while nobody reads",
             until=lambda seen: seen == (1, 1), show=lambda: (pdb(kubectl, namespace), operator.tail()))  # fmt: skip
    assert len(dispatcher_signals.requests) > reads, "the operator never read the fake dispatcher's signal"
    assert (kubectl.get("tfdata", NAME, "-n", namespace) or {})["status"].get("drains") is None

    # A client reads: the budget goes to 0 and a drain's eviction is refused.
    dispatcher_signals.pages[SIGNALS_PATH] = reading()
    started = time.monotonic()
    wait_for(lambda: budget(kubectl, namespace), FLIP_TIMEOUT, "drains to wait while a client reads",
             until=lambda seen: seen == (0, 0), show=lambda: (pdb(kubectl, namespace), operator.tail()))  # fmt: skip
    print(f"the budget went to 0 {time.monotonic() - started:.1f} s after a client started reading")
    status = (kubectl.get("tfdata", NAME, "-n", namespace) or {})["status"]
    assert status["drains"]["message"].startswith("Drains wait: a client reads this static service")
    workers_ready = next(c for c in status["conditions"] if c["type"] == "WorkersReady")
    assert status["drains"]["message"] in workers_ready["message"]
    worker = workers[0]["metadata"]["name"]
    code, said = evict(kubectl, namespace, worker)
    assert code != 0 and "TooManyRequests" in said and "disruption budget" in said, said
    assert kubectl.get("pod", worker, "-n", namespace) is not None

    # The client stops: drains go ahead again, and the eviction goes through.
    dispatcher_signals.pages[SIGNALS_PATH] = idle()
    started = time.monotonic()
    wait_for(lambda: budget(kubectl, namespace), FLIP_TIMEOUT, "drains to go ahead after the client stopped",
             until=lambda seen: seen == (1, 1), show=lambda: (pdb(kubectl, namespace), operator.tail()))  # fmt: skip
    print(f"the budget went back to 1 {time.monotonic() - started:.1f} s after the client stopped")
    code, said = evict(kubectl, namespace, worker)
    assert code == 0, said
    events = kubectl.json("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={NAME}")["items"]
    assert {"DrainsHeld", "DrainsAllowed"} <= {e["reason"] for e in events}
