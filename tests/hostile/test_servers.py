"""Tenants whose pods attack the operator: a hostile server program in place of tfdata-server.

A tenant may run its own image with ``serverProgram: FromImage``; its ``tfdata-server`` can be
anything. Here it is ``image/hostile_server.py`` (the dev node runs no images: the pod's ``PATH``
puts ``image/bin`` first, where a ``tfdata-server`` is that program, as the tenant's image would).
It answers the node's probes as a server would, and the operator's reads of ``/readyz``,
``/serverinfo`` and ``/v1/signals`` with an attack: one byte every 1.5 s, a redirect to a server of
the test's (standing for the cloud's metadata server: its text must never reach a status), a huge
answer, or a garbled one (terminal escapes, control characters, not JSON).

Two things are proved, on the real control plane and node the e2e tier uses:

1. nothing a hostile pod answers gets into a status or an Event beyond a bounded, clean quote:
   no text of the redirect's target (which is never even asked), no control character, no pod
   text longer than the operator's quote (600 characters), and the operator still runs;
2. a slow pod delays only its own service: with 10 dripping services present, a well-behaved
   service (real TensorFlow servers) created after them is Ready within 1.5 times its time on the
   quiet cluster (or 5 s more), the best of 2 of each measured in this run (the figures go to
   figures/hostile-ready.json under the test results directory, and are printed).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from fixtures.hostile import METADATA_PATH, MODES, READS, asked_in, check_clean, hostile_service, written
from fixtures.manifests import service_manifest
from fixtures.support import ROOT, Kubectl, OperatorProcess, Pages, wait_for

IMAGE_BIN = Path(__file__).resolve().parent / "image" / "bin"
# What the redirect's target answers: a secret the operator must never fetch, let alone quote.
SECRET = f"instance-credentials-{secrets.token_hex(8)}"
# The well-behaved service's time to Ready beside the dripping ones, as a multiple of its time on the
# quiet cluster; below READY_FLOOR_SECONDS of difference the ratio is not held (see the test).
READY_RATIO = 1.5
READY_FLOOR_SECONDS = 5.0
DRIPPERS = 10
RUNS = 2


@pytest.fixture(scope="module")
def target() -> Iterator[Pages]:
    """Where the redirects point: a server on 127.0.0.1 that keeps what it was asked."""
    server = Pages({METADATA_PATH: json.dumps(SECRET)})
    yield server
    server.close()


def hostile(name: str, namespace: str, mode: str, target: Pages) -> dict[str, Any]:
    """A TFDataService on the tenant's own image whose servers are the hostile program (the pod's
    PATH puts image/bin first)."""
    path = {"name": "PATH", "value": f"{IMAGE_BIN}:$(PATH)"}
    return hostile_service(
        name, namespace, mode, target.url(METADATA_PATH), "registry.tenant.example/hostile:1", [path]
    )


def good(name: str, namespace: str) -> dict[str, Any]:
    return service_manifest(name, {"shardingPolicy": "DYNAMIC", "workers": {"replicas": 1}}, namespace)


def pod_log(state_dir: Path, namespace: str, pod: str, container: str) -> str:
    path = state_dir / "logs" / "pods" / f"{namespace}_{pod}" / f"{container}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def asked(state_dir: Path, namespace: str, name: str) -> set[str]:
    """The paths the operator asked the service's hostile pods for (what they printed), as pod:path."""
    found: set[str] = set()
    for pod, container in ((f"{name}-dispatcher-0", "dispatcher"), (f"{name}-worker-0", "worker")):
        found |= asked_in(pod_log(state_dir, namespace, pod, container), container)
    return found


def still_running(operator: OperatorProcess, pid: int) -> None:
    assert operator.proc is not None and operator.proc.pid == pid and operator.proc.poll() is None, operator.tail()
    assert operator._alive(), operator.tail()


def queue_wait(operator: OperatorProcess) -> tuple[float, float]:
    """The seconds services waited in the operator's work queue, summed, and how many waits."""
    return (
        operator.total("tfdata_operator_queue_wait_seconds_sum"),
        operator.total("tfdata_operator_queue_wait_seconds_count"),
    )


@dataclass(frozen=True)
class Timing:
    """One well-behaved service from ``kubectl apply`` to its Ready condition True (a watch, not a
    poll), and its pods' own part: until the last of them was Ready (the node's second-resolution
    time), TensorFlow's start on a shared machine, which the operator has no hand in."""

    ready: float
    pods_ready: float
    queue_wait: float  # the mean wait in the operator's queue meanwhile, over every service
    operator_cpu: float  # the CPU seconds the operator process used meanwhile

    def row(self, what: str) -> str:
        operator = self.ready - self.pods_ready
        return (
            f"{what:<30} {self.ready:>8.1f} {self.pods_ready:>11.0f} {operator:>14.1f} {self.queue_wait:>11.2f}"
            f" {self.operator_cpu:>13.1f}"
        )


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_to_ready(kubectl: Kubectl, operator: OperatorProcess, namespace: str, name: str) -> Timing:
    assert operator.proc is not None
    waits, cpu = queue_wait(operator), cpu_seconds(operator.proc.pid)
    applied, started = time.time(), time.monotonic()
    kubectl.apply(good(name, namespace))
    waited = kubectl.run(
        "wait", "--for=condition=Ready", f"tfdata/{name}", "-n", namespace, "--timeout=180s",
        check=False, timeout=190,
    )  # fmt: skip
    took = time.monotonic() - started
    status = (kubectl.get("tfdata", name, "-n", namespace) or {}).get("status")
    assert waited.returncode == 0, f"{name} not Ready after {took:.0f}s: {waited.stderr}\n{json.dumps(status)}"
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}")["items"]
    readied = [
        datetime.fromisoformat(c["lastTransitionTime"].replace("Z", "+00:00")).timestamp()
        for p in pods
        for c in p["status"].get("conditions", [])
        if c["type"] == "Ready" and c["status"] == "True"
    ]
    assert len(readied) == len(pods) == 2, pods
    after = queue_wait(operator)
    mean = (after[0] - waits[0]) / (after[1] - waits[1]) if after[1] > waits[1] else 0.0
    return Timing(took, max(readied) - applied, mean, cpu_seconds(operator.proc.pid) - cpu)


def compare(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, node_state_dir: Path, target: Pages, round_: int
) -> dict[str, Any]:
    """One comparison: a well-behaved service's time to Ready on the quiet cluster, then beside
    ``DRIPPERS`` dripping services (deleted after), each side ``RUNS`` times (the fastest counts:
    TensorFlow's start is most of the time, and on a shared machine one start can be slow for
    reasons of its own, the first from a cold disk cache); its figures, printed as a table."""
    quiet = [time_to_ready(kubectl, operator, namespace, f"quiet-{round_}-{i}") for i in range(RUNS)]
    for i in range(RUNS):
        kubectl.run("delete", "tfdata", f"quiet-{round_}-{i}", "-n", namespace, "--wait=false")
    names = [f"drip-{round_}-{i}" for i in range(DRIPPERS)]
    for name in names:
        kubectl.apply(hostile(name, namespace, "drip", target))
    # The attack is on: the operator has met every dripping pod (each printed what it was asked).
    wait_for(
        lambda: {n: asked(node_state_dir, namespace, n) for n in names},
        120,
        "the operator to read every dripping service's pods",
        until=lambda seen: all(paths >= {"worker:/readyz"} for paths in seen.values()),
    )
    beside = [time_to_ready(kubectl, operator, namespace, f"beside-{round_}-{i}") for i in range(RUNS)]
    for name in [*names, *(f"beside-{round_}-{i}" for i in range(RUNS))]:
        kubectl.run("delete", "tfdata", name, "-n", namespace, "--wait=false")
    best_quiet, best_beside = min(t.ready for t in quiet), min(t.ready for t in beside)
    allowed = max(READY_RATIO * best_quiet, best_quiet + READY_FLOOR_SECONDS)
    print(
        f"\n{'apply -> Ready':<30} {'seconds':>8} {'pods Ready':>11} {'then operator':>14} {'queue wait':>11}"
        f" {'operator CPU':>13}\n"
        + "\n".join(t.row(f"quiet cluster, {i + 1}") for i, t in enumerate(quiet))
        + "\n"
        + "\n".join(t.row(f"beside {DRIPPERS} drippers, {i + 1}") for i, t in enumerate(beside))
        + f"\nbest of {RUNS}: {best_quiet:.1f} s quiet, {best_beside:.1f} s beside the drippers: ratio "
        f"{best_beside / best_quiet:.2f} (held to {READY_RATIO}, or {READY_FLOOR_SECONDS:.0f} s more: "
        f"at most {allowed:.1f} s)"
    )
    return {
        "quiet": [{k: round(v, 2) for k, v in asdict(t).items()} for t in quiet],
        "beside_drippers": [{k: round(v, 2) for k, v in asdict(t).items()} for t in beside],
        "drippers": DRIPPERS,
        "quiet_seconds": round(best_quiet, 1),
        "beside_drippers_seconds": round(best_beside, 1),
        "ratio": round(best_beside / best_quiet, 2),
        "allowed_seconds": round(allowed, 1),
        "held": best_beside <= allowed,
    }


def test_a_slow_pod_delays_only_its_own_service(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, node_state_dir: Path, target: Pages
) -> None:
    # 1.5 times, but never less than 5 s more: Ready is seen in steps of the readiness probe's
    # period (2 s) and the operator's status write after it, so two such steps of jitter are not the
    # drippers' doing. Before the fix, the service had no status at all 300 s later. A comparison
    # that fails is made once more, both sides again: the machine is shared, and TensorFlow's start
    # beside the drippers can meet load that the quiet one did not (the table shows the pods' part).
    # An operator that a slow pod holds up fails both.
    rounds = [compare(kubectl, operator, namespace, node_state_dir, target, 0)]
    if not rounds[0]["held"]:
        rounds.append(compare(kubectl, operator, namespace, node_state_dir, target, 1))
    # A folder of its own: every *.json beside the tiers' is read as a tier's result (results.py).
    results = Path(os.environ.get("TFDATA_TEST_RESULTS") or ROOT / ".local" / "test-results") / "figures"
    results.mkdir(parents=True, exist_ok=True)
    (results / "hostile-ready.json").write_text(json.dumps(rounds, indent=2) + "\n")
    assert rounds[-1]["held"], f"{rounds}\n{operator.tail()}"


def test_hostile_answers_reach_no_status_and_the_redirect_is_never_followed(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, node_state_dir: Path, target: Pages
) -> None:
    assert operator.proc is not None
    pid = operator.proc.pid
    for mode in MODES:
        kubectl.apply(hostile(mode, namespace, mode, target))
    # Every attack reached the operator on every endpoint it reads: the dispatcher's /serverinfo and
    # /v1/signals, the unready worker's /readyz; and each service has a status explaining itself.
    wait_for(
        lambda: {m: asked(node_state_dir, namespace, m) for m in MODES},
        120,
        "the operator to read every hostile pod's endpoints",
        until=lambda seen: all(paths >= READS for paths in seen.values()),
        show=operator.tail,
    )

    def explained() -> dict[str, str]:
        found = {}
        for mode in MODES:
            status = (kubectl.get("tfdata", mode, "-n", namespace) or {}).get("status") or {}
            ready = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
            found[mode] = f"{ready.get('status')} {ready.get('reason')}: {ready.get('message', '')[:300]}"
        return found

    seen = wait_for(explained, 60, "a Ready=False status on every hostile service",
                    until=lambda f: all(v.startswith("False ") for v in f.values()))  # fmt: skip
    print("\n".join(f"{mode}: {said}" for mode, said in seen.items()))
    # Two resyncs more (5 s each): every attack is met again, and what the operator wrote stays clean.
    time.sleep(12)
    check_clean(written(kubectl, namespace), SECRET)
    assert target.requests == [], f"the operator followed a redirect to {target.base}: {target.requests}"
    still_running(operator, pid)
    for mode in MODES:
        kubectl.run("delete", "tfdata", mode, "-n", namespace, "--wait=false")
