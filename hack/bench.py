"""`make bench`: the operator's speed and cost at 200 and 1,000 TFDataServices, beside the ceiling of the same run.

On a dev cluster of its own (etcd, kube-apiserver with an audit log, controller-manager, scheduler)
with ``--kwok-nodes`` kwok nodes: every service's pods (a dispatcher and 4 workers) tolerate their
taint, so they are scheduled, their journal claims bound, and they turn Running and Ready as a
kubelet would report them (nothing runs), loading the operator's pod watch and status as a real
cluster does. ``--kwok-nodes 0`` measures node-less, as before: pods stay Pending. In one run:

- ceiling: the children of N services (the manifests `render` prints, without owner references)
  created directly with 8 threads, as fast as the API server takes them;
- bursts of 200 and 1,000 TFDataServices applied into a running operator: the time until every
  service has all its children and its first status, as services/s and as a ratio to the ceiling;
  apply -> children latency per service (p50/p99) during the burst;
- single applies into an idle operator: apply -> children p50/p99;
- the operator's RSS idle, at 200 and at 1,000 services;
- the operator's own API requests over an idle minute at 1,000 services, by verb, from the API
  server's audit log (user agents tfdata-operator/... for the reconcile loop, kopf/... for the watches).

Prints a table and writes .local/bench/last.json (the previous run's file is kept as previous.json,
and its figures are printed beside the new ones). Figures, not pass/fail: nothing here is a test.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from tfdata_operator import cli
from tfdata_operator.builders import BuildSettings

import devcluster

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / ".local" / "bench"
THREADS = 8
# On kwok's nodes (see the docstring); a real kubelet ignores the toleration.
ON_KWOK = {"tolerations": [devcluster.KWOK_TOLERATION]}
SPEC = {"shardingPolicy": "DYNAMIC", "dispatcher": ON_KWOK, "workers": {"replicas": 4, **ON_KWOK}}


def service(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "tfdata.dev/v1alpha1", "kind": "TFDataService",
            "metadata": {"name": name, "namespace": namespace}, "spec": SPEC}  # fmt: skip


class Api:
    """Just enough of the API for the benchmark: POST, GET, and a watch of TFDataServices."""

    def __init__(self, cluster: devcluster.Cluster) -> None:
        config = yaml.safe_load(cluster.kubeconfig.read_text())
        self.server = config["clusters"][0]["cluster"]["server"]
        self.token = config["users"][0]["user"]["token"]
        ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]).decode()
        self.ssl = ssl.create_default_context(cadata=ca)

    def request(self, method: str, path: str, body: Any = None, timeout: float = 60) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Content-Type", "application/json")
        req.add_header("User-Agent", "tfdata-bench")
        with urllib.request.urlopen(req, context=self.ssl, timeout=timeout) as response:
            return json.loads(response.read() or b"{}")

    def create(self, manifest: dict[str, Any]) -> None:
        api_version, kind = manifest["apiVersion"], manifest["kind"]
        ns = manifest["metadata"]["namespace"]
        prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        plural = {"Service": "services", "ConfigMap": "configmaps", "StatefulSet": "statefulsets",
                  "PodDisruptionBudget": "poddisruptionbudgets", "NetworkPolicy": "networkpolicies",
                  "HorizontalPodAutoscaler": "horizontalpodautoscalers", "TFDataService": "tfdataservices",
                  "Namespace": "namespaces"}[kind]  # fmt: skip
        path = f"{prefix}/{plural}" if kind == "Namespace" else f"{prefix}/namespaces/{ns}/{plural}"
        self.request("POST", path, manifest)

    def watch_status(self, namespace: str, seen: dict[str, float], stop: threading.Event) -> None:
        """Records when each TFDataService first has a status (the create reconcile writes it after its children)."""
        path = f"/apis/tfdata.dev/v1alpha1/namespaces/{namespace}/tfdataservices"
        version = self.request("GET", path)["metadata"]["resourceVersion"]
        while not stop.is_set():
            req = urllib.request.Request(f"{self.server}{path}?watch=1&resourceVersion={version}&timeoutSeconds=60")
            req.add_header("Authorization", f"Bearer {self.token}")
            with urllib.request.urlopen(req, context=self.ssl, timeout=90) as stream:
                for line in stream:
                    event = json.loads(line)
                    obj = event["object"]
                    version = obj["metadata"].get("resourceVersion", version)
                    if (obj.get("status") or {}).get("observedGeneration"):
                        seen.setdefault(obj["metadata"]["name"], time.monotonic())
                    if stop.is_set():
                        return


def children_of(namespace: str, name: str) -> list[dict[str, Any]]:
    body = {**service(namespace, name), "metadata": {"name": name, "namespace": namespace}}
    rendered = cli.render_document(body, name, cli.DEFAULT_SERVER_IMAGE, BuildSettings())
    for manifest in rendered:
        # No owner (the garbage collector would delete them) and not the operator's labels (its watches
        # would cache them).
        manifest["metadata"].pop("ownerReferences", None)
        manifest["metadata"].pop("labels", None)
        manifest["metadata"]["namespace"] = namespace
    return rendered


def namespace(api: Api, name: str) -> None:
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "namespace": ""}})


def ceiling(api: Api, count: int) -> float:
    """N services' children created directly, in services per second; then deleted again, so that
    their pods do not load the control plane while the operator is measured."""
    ns = f"ceiling-{count}"
    namespace(api, ns)
    manifests = [m for i in range(count) for m in children_of(ns, f"s{i}")]
    started = time.monotonic()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(api.create, manifests))
    rate = count / (time.monotonic() - started)
    api.request("DELETE", f"/api/v1/namespaces/{ns}")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            api.request("GET", f"/api/v1/namespaces/{ns}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                break
            raise
        time.sleep(1)
    return rate


def burst(api: Api, count: int, ns: str) -> dict[str, Any]:
    namespace(api, ns)
    seen: dict[str, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=api.watch_status, args=(ns, seen, stop), daemon=True)
    watcher.start()
    time.sleep(1)
    applied: dict[str, float] = {}

    def apply(i: int) -> None:
        api.create(service(ns, f"s{i}"))
        applied[f"s{i}"] = time.monotonic()

    started = time.monotonic()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(apply, range(count)))
    deadline = time.monotonic() + max(300, count)
    while len(seen) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    done = max(seen.values(), default=time.monotonic())
    latencies = sorted(seen[n] - applied[n] for n in seen if n in applied)
    return {
        "services": count,
        "completed": len(seen),
        "seconds": round(done - started, 2),
        "services_per_second": round(len(seen) / (done - started), 2),
        "apply_to_children_p50_s": _pct(latencies, 50),
        "apply_to_children_p99_s": _pct(latencies, 99),
    }


def singles(api: Api, count: int, ns: str) -> dict[str, Any]:
    namespace(api, ns)
    seen: dict[str, float] = {}
    stop = threading.Event()
    threading.Thread(target=api.watch_status, args=(ns, seen, stop), daemon=True).start()
    time.sleep(1)
    latencies = []
    for i in range(count):
        name = f"one{i}"
        started = time.monotonic()
        api.create(service(ns, name))
        deadline = started + 60
        while name not in seen and time.monotonic() < deadline:
            time.sleep(0.005)
        latencies.append(seen.get(name, deadline) - started)
        time.sleep(0.2)
    stop.set()
    latencies.sort()
    return {"services": count, "apply_to_children_p50_s": _pct(latencies, 50),
            "apply_to_children_p99_s": _pct(latencies, 99)}  # fmt: skip


def _pct(values: list[float], p: int) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(len(values) * p / 100))], 3)


METRICS_PORT = 19091


def operator_requests() -> float:
    url = f"http://127.0.0.1:{METRICS_PORT}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tfdata_operator_api_requests_total{"))  # fmt: skip


def wait_quiet(quiet: float, timeout: float) -> float:
    """Seconds until the operator's request count stayed the same for ``quiet`` seconds."""
    started = time.monotonic()
    last, since = operator_requests(), time.monotonic()
    while time.monotonic() - started < timeout:
        time.sleep(2)
        now = operator_requests()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return round(time.monotonic() - started, 1)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def audit_counts(log: Path, since: str, until: str) -> dict[str, int]:
    """Requests by user agent family and verb between two RFC 3339 times (ResponseComplete stage only)."""
    counts: Counter[str] = Counter()
    with open(log, encoding="utf-8") as f:
        for line in f:
            event = json.loads(line)
            if (
                event.get("stage") != "ResponseComplete"
                or not since <= event.get("requestReceivedTimestamp", "") < until
            ):
                continue
            agent = event.get("userAgent", "")
            who = "reconcile" if agent.startswith("tfdata-operator/") else "kopf" if agent.startswith("kopf") else None
            if who:
                counts[f"{who} {event['verb']}"] += 1
    return dict(sorted(counts.items()))


def ready_pods(api: Api) -> int:
    """Pods whose Ready condition is True (kwok's, when the cluster has its nodes)."""
    pods = api.request("GET", "/api/v1/pods", timeout=300)["items"]
    return sum(
        any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (p.get("status") or {}).get("conditions", [])
        )
        for p in pods
    )


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + ".000000Z"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="200,1000", help="burst sizes, comma-separated")
    parser.add_argument("--idle-seconds", type=float, default=60, help="the idle window for the request count")
    parser.add_argument(
        "--kwok-nodes", type=int, default=10, help="kwok nodes whose pods turn Ready (0: node-less, pods stay Pending)"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    OUT.mkdir(parents=True, exist_ok=True)
    state = OUT / f"cluster-{os.getpid()}"
    state.mkdir(parents=True)
    (state / devcluster.AUDIT_POLICY).write_text(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  - level: Metadata\n"
    )
    components = devcluster.with_kwok(args.kwok_nodes) if args.kwok_nodes else devcluster.COMPONENTS
    cluster = devcluster.up(state, components)
    operator = None
    try:
        env = cluster.env()
        devcluster.install_crds(cluster)
        api = Api(cluster)
        results: dict[str, Any] = {"when": now_rfc3339(), "cpus": os.cpu_count(), "kwok_nodes": args.kwok_nodes}
        print("ceiling ...", flush=True)
        results["ceiling_services_per_second"] = {n: round(ceiling(api, n), 2) for n in sizes}
        log = open(state / "logs" / "operator.log", "wb")  # noqa: SIM115 - the child keeps it
        operator = subprocess.Popen(
            [str(Path(sys.executable).with_name("tfdata-operator")), "run", "--log-format=plain",
             f"--metrics-port={METRICS_PORT}", "--metrics-address=127.0.0.1"],
            env={**env, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        time.sleep(5)
        results["rss_mb"] = {"idle": rss_mb(operator.pid)}
        print("single applies into an idle operator ...", flush=True)
        results["idle_single_applies"] = singles(api, 20, "singles")
        results["bursts"] = {}
        total = 20
        for n in sizes:
            print(f"burst of {n} ...", flush=True)
            results["bursts"][n] = figures = burst(api, n, f"burst-{n}")
            figures["ratio_to_ceiling"] = round(
                figures["services_per_second"] / results["ceiling_services_per_second"][n], 2
            )
            total += n
            time.sleep(5)
            results["rss_mb"][f"{total} services"] = rss_mb(operator.pid)
        print(f"idle window of {args.idle_seconds:.0f} s at {total} services ...", flush=True)
        # Idle means settled: the controllers still create pods (and so change the statuses the
        # operator reports) for a while after the burst. Wait until the operator sent nothing for 30 s.
        settled = wait_quiet(30, 600)
        results["settled_after_s"] = settled
        since = now_rfc3339()
        time.sleep(args.idle_seconds)
        until = now_rfc3339()
        time.sleep(3)  # the audit log is written in batches
        counts = audit_counts(state / "logs" / "audit.log", since, until)
        per_minute = {k: round(v * 60 / args.idle_seconds, 1) for k, v in counts.items()}
        results["idle_requests_per_minute"] = {"services": total, **per_minute}
        results["rss_mb"]["idle at the end"] = rss_mb(operator.pid)
        results["pods_ready_at_the_end"] = ready_pods(api)
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(30)
        devcluster.down(state)
    report(results)
    shutil.rmtree(state, ignore_errors=True)
    return 0


def report(results: dict[str, Any], prefix: str = "") -> None:
    """Prints ``results`` as a table beside the previous run's, and keeps them as ``<prefix>last.json``."""
    last, previous = OUT / f"{prefix}last.json", OUT / f"{prefix}previous.json"
    before = json.loads(last.read_text()) if last.exists() else None
    if last.exists():
        last.replace(previous)
    last.write_text(json.dumps(results, indent=2, default=str))
    rows = _rows(results)
    old = dict(_rows(before)) if before else {}
    width = max(len(k) for k, _ in rows)
    print(f"\n{'figure'.ljust(width)}  {'this run':>12}  {'previous':>12}")
    for key, value in rows:
        print(f"{key.ljust(width)}  {value!s:>12}  {old.get(key, '-')!s:>12}")
    print(f"\nwritten to {last}")


def _rows(results: dict[str, Any] | None, prefix: str = "") -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for key, value in (results or {}).items():
        if isinstance(value, dict):
            rows += _rows(value, f"{prefix}{key} / ")
        else:
            rows.append((f"{prefix}{key}", value))
    return rows


if __name__ == "__main__":
    sys.exit(main())
