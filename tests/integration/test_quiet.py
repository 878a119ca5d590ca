"""A settled namespace costs the operator nothing, and a service that stays unready little.

What `make bench` found at scale, on this tier's kwok node: a dispatcher that waits for its claim
queues a reconcile with every event of its service's pods, and each reconcile listed the claim's
Events again. Here one service turns Ready on kwok's node and one never does (its claim's
StorageClass does not exist, so the scheduler waits for the claim forever); then the unready one is
touched every second, as a busy cluster's events would queue it. Over that window the operator
may list the namespace's Warning Events about claims once per resync (the operator runs with a 5 s
resync here) and write nothing: the status says the same thing throughout. A third, static service
turns Ready too: its workers' disruption budget depends on whether a client reads, so the operator
asks its dispatcher at most every 30 s (never the API server; kwok's pods never answer, so less often
once it is backed off); the budget and the status stay as they are, so nothing is written for it
either.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tfdata_operator.plan import drain

import devcluster
from fixtures.manifests import API_VERSION
from fixtures.support import Kubectl, OperatorProcess, kubelet_nodes, wait_for

RESYNC_SECONDS = 5  # OperatorProcess's TFDATA_RESYNC_SECONDS
# At least one re-reading of the static service's signal falls in the window.
WINDOW_SECONDS = int(drain.RECHECK_SECONDS) + RESYNC_SECONDS
TIMEOUT = 90
# A real kubelet pulls the image and starts TensorFlow; kwok answers at once.
KIND_TIMEOUT = 240
KWOK = json.dumps(devcluster.KWOK_TOLERATION)

READY = f"""\
apiVersion: {API_VERSION}
kind: TFDataService
metadata:
  name: quiet-ready
spec:
  shardingPolicy: DYNAMIC
  # Every quantity written otherwise than the API server stores it (1Gi, 500m, 1, 2Gi, ...): the
  # operator writes each as stored, or it would apply a StatefulSet again at every reconcile (and the
  # journal claim's size, which a StatefulSet cannot change, would have it recreated).
  dispatcher:
    resources: {{requests: {{cpu: "0.5", memory: 1024Mi}}, limits: {{memory: 2048Mi}}}}
    storage: {{size: 1024Mi}}
    tolerations: [{KWOK}]
  workers:
    replicas: 2
    tmpSizeLimit: 2048Mi
    resources: {{requests: {{cpu: 1000m, memory: 0.5Gi}}, limits: {{cpu: 2000m, ephemeral-storage: 4096Mi}}}}
    volumes: [{{name: scratch, emptyDir: {{sizeLimit: 1024Mi}}}}]
    env: [{{name: CPU_LIMIT, valueFrom: {{resourceFieldRef: {{resource: limits.cpu, divisor: 1000m}}}}}}]
    tolerations: [{KWOK}]
"""
# Its dispatcher's signal cannot be read from here (kwok's pod addresses lead nowhere): whether a
# client reads is unknown, which counts as reading, so drains wait; it is read again at most every 30 s.
# Only on kwok's node: a small kind node has no CPU left for its real servers.
STATIC = f"""\
apiVersion: {API_VERSION}
kind: TFDataService
metadata:
  name: quiet-static
spec:
  shardingPolicy: FILE
  dispatcher: {{tolerations: [{KWOK}]}}
  workers: {{replicas: 2, tolerations: [{KWOK}]}}
"""
UNREADY = f"""\
apiVersion: {API_VERSION}
kind: TFDataService
metadata:
  name: quiet-unready
spec:
  shardingPolicy: DYNAMIC
  dispatcher:
    storage: {{storageClassName: does-not-exist}}
    tolerations: [{KWOK}]
  workers: {{replicas: 1, tolerations: [{KWOK}]}}
"""


def status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return (kubectl.get("tfdata", name, "-n", namespace) or {}).get("status") or {}


def ready_reason(kubectl: Kubectl, namespace: str, name: str) -> str | None:
    ready = [c for c in status(kubectl, namespace, name).get("conditions") or [] if c["type"] == "Ready"]
    return ready[0]["reason"] if ready else None


def requests(operator: OperatorProcess) -> dict[str, float]:
    """The reconcile loop's requests so far, by verb (a LIST is counted as a GET)."""
    counts: dict[str, float] = {}
    for key, value in operator.metrics().items():
        if key.startswith("tfdata_operator_api_requests_total{"):
            verb = key.split('verb="', 1)[1].split('"', 1)[0]
            counts[verb] = counts.get(verb, 0) + value
    return counts


@pytest.fixture(scope="module")
def applied(kubectl: Kubectl, namespace: str, operator: OperatorProcess) -> None:
    on_kwok = not kubelet_nodes(kubectl.json("get", "nodes"))
    for manifest in (READY, STATIC, UNREADY) if on_kwok else (READY, UNREADY):
        kubectl.run("apply", "-n", namespace, "-f", "-", input=manifest)


def test_a_settled_namespace_sends_no_request_and_an_unready_service_one_list_per_resync(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, applied: None
) -> None:
    on_kwok = not kubelet_nodes(kubectl.json("get", "nodes"))
    timeout = TIMEOUT if on_kwok else KIND_TIMEOUT
    ready = ("quiet-ready", "quiet-static") if on_kwok else ("quiet-ready",)

    def reasons() -> tuple[str | None, ...]:
        return tuple(ready_reason(kubectl, namespace, name) for name in (*ready, "quiet-unready"))

    wait_for(reasons, timeout, f"{' and '.join(ready)} Ready and quiet-unready ProvisioningFailed",
             until=lambda seen: seen == (*(["Ready"] * len(ready)), "ProvisioningFailed"))  # fmt: skip
    if on_kwok:
        wait_for(lambda: (status(kubectl, namespace, "quiet-static").get("drains") or {}).get("maxUnavailable"), 60,
                 "quiet-static's drains to wait (its signal is unknown)", until=lambda seen: seen == 0)  # fmt: skip
    said = status(kubectl, namespace, "quiet-unready")
    said_static = status(kubectl, namespace, "quiet-static")
    # Settled: a resync and then some with no request at all but the diagnosis's reads.
    wait_for(lambda: _only_reads_for(operator, RESYNC_SECONDS + 2), 60, "the operator to send nothing but reads",
             show=lambda: (requests(operator), operator.tail()))  # fmt: skip

    names = (*ready, "quiet-unready")
    before, reads_before = requests(operator), operator.total("tfdata_operator_signal_reads_total")
    reconciled_before = {name: operator.reconciles(namespace, name) for name in names}
    started = time.monotonic()
    touches = 0
    while time.monotonic() - started < WINDOW_SECONDS:  # each annotation is an event: a reconcile
        kubectl.run("annotate", "--overwrite", "tfdata/quiet-unready", "-n", namespace, f"example.com/touch={touches}")
        touches += 1
        time.sleep(1)
    after, reads = requests(operator), operator.total("tfdata_operator_signal_reads_total") - reads_before
    reconciled = {name: _grown(reconciled_before[name], operator.reconciles(namespace, name)) for name in names}
    elapsed = time.monotonic() - started
    sent = {verb: after[verb] - before.get(verb, 0) for verb in after if after[verb] != before.get(verb, 0)}

    resyncs = WINDOW_SECONDS / RESYNC_SECONDS
    # Nothing sent proves nothing unless the operator really reconciled: a stalled queue, or a
    # reconcile that returns before reading, would send nothing too. Every service is queued at each
    # resync (the one queued last may not have finished when the window ends), the unready one at
    # every touch besides; and a reconcile that wrote nothing counts as idle.
    least = int(elapsed // RESYNC_SECONDS)
    for name in names:
        grown = reconciled[name]
        assert sum(grown.values()) >= (least if name == "quiet-unready" else least - 1), (
            f"{name} reconciled {grown} over {elapsed:.0f} s ({touches} touches of quiet-unready, a resync every "
            f"{RESYNC_SECONDS} s): the operator did not reconcile it at every resync"
        )
        assert set(grown) == {"idle"}, f"{name}'s reconciles over the window: {grown}"
    assert set(sent) <= {"get"}, f"requests other than the diagnosis's LISTs over the window: {sent}"
    assert sent.get("get", 0) <= resyncs + 1, (
        f"{sent.get('get', 0):.0f} LISTs of claims' Events over {WINDOW_SECONDS} s ({touches} reconciles "
        f"queued, a resync every {RESYNC_SECONDS} s): at most one per resync"
    )
    assert status(kubectl, namespace, "quiet-unready") == said
    assert status(kubectl, namespace, "quiet-static") == said_static
    # The static service's signal, at most once per drain.RECHECK_SECONDS (the DYNAMIC ones are never
    # asked); kwok's pods never answer, so after a few failures it is asked less often still (the
    # back-off, up to 2 minutes: controller/readers.py), and a window may fall between two reads.
    expected = (0, 2) if on_kwok else (0, 0)
    assert expected[0] <= reads <= expected[1], f"{reads:.0f} reads of /v1/signals over {WINDOW_SECONDS} s"


def _grown(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The reconciles counted between two readings of ``OperatorProcess.reconciles``, by result."""
    return {result: n - before.get(result, 0) for result, n in after.items() if n != before.get(result, 0)}


def _only_reads_for(operator: OperatorProcess, seconds: float) -> bool:
    """Whether the operator sent nothing but GETs (LISTs) over the next ``seconds``."""
    before = requests(operator)
    time.sleep(seconds)
    after = requests(operator)
    return all(verb == "get" or after[verb] == before.get(verb, 0) for verb in after)
