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
- the operator's RSS idle, at 200 and at 1,000 services, its peak, and what it holds beyond idle per
  1,000 of the services' pods;
- the operator's own API requests over an idle minute at 1,000 services, from the API server's audit
  log (user agents tfdata-operator/... for the reconcile loop, kopf/... for the watches): by verb,
  resource and subresource, the objects asked most, and the fields that differ between consecutive
  PATCHes of the same object. The window starts once every StatefulSet has settled (the
  controllers are done: each step of theirs changes a status the operator reports) and the
  operator has sent nothing for 30 s; both times are reported. When the operator never gets
  there, the run says so and after how long, and counts the last minute of that wait as what it
  is (not idle).

The audit log (bodies of PATCHes of the operator's kinds, metadata of everything else) is kept,
gzipped, as .local/bench/audit.log.gz; `benchmarks/bench.py --read-audit FILE --since T --until T`
prints the same breakdown for any window of it.

Prints a table and writes .local/bench/last.json (the previous run's file is kept as previous.json,
and its figures are printed beside the new ones). Figures, not pass/fail: nothing here is a test.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import gzip
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tfdata_operator import cli
from tfdata_operator.plan import scaling
from tfdata_operator.render.builders import BuildSettings

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


def operator_requests(attempts: int = 4) -> float:
    """The operator's API requests so far, from its /metrics. A busy operator (a burst of 1,000
    services on a loaded 2-core machine) can take longer than a read's 15 s to answer: it is asked
    again, and only the last failure is raised."""
    url = f"http://127.0.0.1:{METRICS_PORT}/metrics"
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(url, timeout=15) as response:
                text = response.read().decode()
            break
        except (TimeoutError, OSError) as exc:
            if attempt == attempts - 1:
                raise
            print(f"  the operator's /metrics did not answer ({exc}); asking again", flush=True)
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tfdata_operator_api_requests_total{"))  # fmt: skip


def unsettled_statefulsets(api: Api) -> int:
    """StatefulSets (every service's two) not yet settled: some pod missing, not ready or not updated."""
    items = api.request("GET", "/apis/apps/v1/statefulsets", timeout=300)["items"]
    return sum(not scaling.statefulset_settled(sts) for sts in items)


def with_controller_qps(components: tuple[devcluster.Component, ...], qps: int) -> tuple[devcluster.Component, ...]:
    """The cluster with its controller-manager's client allowed ``qps`` requests/s per controller:
    at Kubernetes' default (20) the StatefulSet controller alone needs minutes for a burst of
    hundreds of services, and every step it takes changes a status the operator reports."""

    def replaced(component: devcluster.Component) -> devcluster.Component:
        if component.name != "kube-controller-manager":
            return component
        command = component.command
        flags = [f"--kube-api-qps={qps}", f"--kube-api-burst={2 * qps}"]
        return dataclasses.replace(component, command=lambda ctx: [*command(ctx), *flags])

    return tuple(map(replaced, components))


@dataclasses.dataclass
class Settling:
    """How the cluster and the operator came to rest after the bursts (seconds from the last one)."""

    cluster_after: float | None = None  # every StatefulSet settled: no status left to change
    operator_after: float | None = None  # the operator has sent nothing for QUIET seconds
    unsettled: int = -1  # StatefulSets not settled at the last look
    waited: float = 0.0


QUIET = 30.0


def wait_settled(api: Api, timeout: float) -> Settling:
    """Waits until the operator has sent nothing for QUIET seconds and the cluster is settled (or
    has not moved on for a minute: pods that never get ready), at most ``timeout`` seconds.

    The StatefulSet controller works through a burst at its client's rate limit long after the
    operator created everything, and each step changes a status the operator reports: an operator
    that is still writing then is not idle for nothing. So both are watched, and reported apart."""
    started = time.monotonic()
    settling = Settling()
    last, since = operator_requests(), started
    stalled_since, next_look = started, started
    while (now := time.monotonic()) - started < timeout:
        if settling.cluster_after is None and now >= next_look:
            unsettled = unsettled_statefulsets(api)
            if unsettled != settling.unsettled:
                settling.unsettled, stalled_since = unsettled, now
            if unsettled == 0:
                settling.cluster_after = round(now - started, 1)
            next_look = now + 10
        count = operator_requests()
        if count != last:
            last, since = count, now
        quiet = now - since >= QUIET
        settling.operator_after = round(now - started, 1) if quiet else None
        if quiet and (settling.cluster_after is not None or now - stalled_since >= 60):
            break
        time.sleep(2)
    settling.waited = round(time.monotonic() - started, 1)
    return settling


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """The process's resident memory now (VmRSS), or the most it has had (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


PODS_PER_SERVICE = 1 + SPEC["workers"]["replicas"]


def per_thousand_pods(rss: float, idle: float, services: int) -> float:
    """What the operator holds beyond its idle RSS, per 1,000 of the services' pods (MB)."""
    return round((rss - idle) * 1000 / (services * PODS_PER_SERVICE), 1)


# The operator's writes with their bodies (which fields a repeated PATCH changes); everything else by metadata.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    verbs: [patch]
    resources:
      - {group: tfdata.dev, resources: [tfdataservices, tfdataservices/status, tfdataservices/scale]}
      - {group: apps, resources: [statefulsets]}
      - {group: "", resources: [services, configmaps]}
      - {group: policy, resources: [poddisruptionbudgets]}
      - {group: networking.k8s.io, resources: [networkpolicies]}
      - {group: autoscaling, resources: [horizontalpodautoscalers]}
  - level: Metadata
"""
TOP_OBJECTS = 10


def _who(event: dict[str, Any]) -> str | None:
    agent = event.get("userAgent", "")
    return "reconcile" if agent.startswith("tfdata-operator/") else "kopf" if agent.startswith("kopf") else None


def _resource(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    resource = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return resource + (" (dry run)" if "dryRun=" in event.get("requestURI", "") else "")


def _paths(a: Any, b: Any, prefix: str = "") -> list[str]:
    """The paths where two request bodies differ (lists compared whole, by index when equally long)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in sorted(set(a) | set(b)) for p in _paths(a.get(k), b.get(k), f"{prefix}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b, strict=True)) for p in _paths(x, y, f"{prefix}[{i}]")]
    return [] if a == b else [prefix or "."]


def audit_files(logs: Path) -> list[Path]:
    """The API server's audit log in order: the files it rotated out at 100 MB
    (audit-<time>.log), then audit.log."""
    return sorted(logs.glob("audit-*.log")) + [p for p in [logs / "audit.log"] if p.exists()]


def _events(files: list[Path]) -> Iterator[dict[str, Any]]:
    for log in files:
        opener = gzip.open if log.suffix == ".gz" else open
        with opener(log, "rt", encoding="utf-8") as f:
            yield from map(json.loads, f)


def audit_breakdown(files: list[Path], since: str, until: str, seconds: float) -> dict[str, Any]:
    """The operator's requests between two RFC 3339 times (ResponseComplete stage only), per minute:
    by who (reconcile loop or watches), verb and resource[/subresource]; the reconcile loop's most
    asked objects; and the fields that differed between its consecutive PATCHes of one object."""
    per_minute = 60 / seconds
    counts: Counter[str] = Counter()
    objects: Counter[str] = Counter()
    changed: Counter[str] = Counter()
    last_body: dict[str, Any] = {}
    for event in _events(files):
        if (
            event.get("stage") != "ResponseComplete"
            or not since <= event.get("requestReceivedTimestamp", "") < until
            or (who := _who(event)) is None
        ):
            continue
        resource = _resource(event)
        counts[f"{who} {event['verb']} {resource}"] += 1
        if who != "reconcile":
            continue
        ref = event.get("objectRef") or {}
        name = "/".join(filter(None, (ref.get("namespace"), ref.get("name")))) or "(collection)"
        what = f"{event['verb']} {resource} {name}"
        if event["verb"] == "list" and (selector := urllib.parse.urlsplit(event.get("requestURI", "")).query):
            what += f" ?{urllib.parse.unquote(selector)}"
        objects[what] += 1
        if event["verb"] == "patch" and "requestObject" in event:
            key = f"{resource} {name}"
            if key in last_body:
                for path in _paths(last_body[key], event["requestObject"]) or ["(none: the same body again)"]:
                    changed[f"{resource} {path}"] += 1
            last_body[key] = event["requestObject"]
    return {
        "by_verb_and_resource": {k: round(v * per_minute, 1) for k, v in sorted(counts.items())},
        "top_objects": {k: round(v * per_minute, 1) for k, v in objects.most_common(TOP_OBJECTS)},
        "fields_changed_between_patches": {k: round(v * per_minute, 1) for k, v in changed.most_common(TOP_OBJECTS)},
    }


def keep_audit_log(files: list[Path]) -> Path:
    """The whole audit log, in one gzipped file beside last.json (the cluster's state directory is deleted)."""
    kept = OUT / "audit.log.gz"
    with gzip.open(kept, "wb", compresslevel=3) as dst:
        for log in files:
            with open(log, "rb") as src:
                shutil.copyfileobj(src, dst)
    return kept


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


T = TypeVar("T")


def in_turn(variants: Sequence[T], round_: int) -> list[T]:
    """The order of ``variants`` in round ``round_`` (from 0) of an interleaved benchmark: each round
    starts with the next one (A B, B A, A B, ...; A B C, B C A, C A B, ...), so that no variant always
    goes first, on a machine that warms up or gets busier within a round."""
    turn = round_ % len(variants) if variants else 0
    return [*variants[turn:], *variants[:turn]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="200,1000", help="burst sizes, comma-separated")
    parser.add_argument("--idle-seconds", type=float, default=60, help="the idle window for the request count")
    parser.add_argument(
        "--kwok-nodes", type=int, default=10, help="kwok nodes whose pods turn Ready (0: node-less, pods stay Pending)"
    )
    parser.add_argument("--no-ceiling", action="store_true", help="skip the ceiling (a quicker look at the operator)")
    parser.add_argument(
        "--controller-qps", type=int, default=100,
        help="the controller-manager's --kube-api-qps (burst twice that), as large clusters raise it; 0: Kubernetes' "
        "default, 20 per controller (at 500 services its StatefulSet controller then ran 8 min after the burst)",
    )  # fmt: skip
    parser.add_argument(
        "--settle-seconds", type=float, default=900, help="how long to wait for the cluster and the operator to settle"
    )
    parser.add_argument("--read-audit", type=Path, help="only print the operator's requests in a kept audit log")
    parser.add_argument("--since", default="", help="with --read-audit: from this RFC 3339 time")
    parser.add_argument("--until", default="9", help="with --read-audit: until this RFC 3339 time")
    args = parser.parse_args()
    if args.read_audit:
        print(json.dumps(audit_breakdown([args.read_audit], args.since, args.until, 60), indent=2))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    OUT.mkdir(parents=True, exist_ok=True)
    state = OUT / f"cluster-{os.getpid()}"
    state.mkdir(parents=True)
    (state / devcluster.AUDIT_POLICY).write_text(AUDIT_POLICY)
    components = devcluster.with_kwok(args.kwok_nodes) if args.kwok_nodes else devcluster.COMPONENTS
    if args.controller_qps:
        components = with_controller_qps(components, args.controller_qps)
    cluster = devcluster.up(state, components)
    operator = None
    try:
        env = cluster.env()
        devcluster.install_crds(cluster)
        api = Api(cluster)
        results: dict[str, Any] = {"when": now_rfc3339(), "cpus": os.cpu_count(), "kwok_nodes": args.kwok_nodes}
        if not args.no_ceiling:
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
            if not args.no_ceiling:
                figures["ratio_to_ceiling"] = round(
                    figures["services_per_second"] / results["ceiling_services_per_second"][n], 2
                )
            total += n
            time.sleep(5)
            results["rss_mb"][f"{total} services"] = rss = rss_mb(operator.pid)
            results.setdefault("rss_mb_per_1000_pods", {})[f"{total} services"] = per_thousand_pods(
                rss, results["rss_mb"]["idle"], total
            )
        print(f"waiting up to {args.settle_seconds:.0f} s for the cluster to settle and the operator to send "
              f"nothing for {QUIET:.0f} s ...", flush=True)  # fmt: skip
        settling = wait_settled(api, args.settle_seconds)
        results["cluster_settled_after_s"] = (
            settling.cluster_after
            if settling.cluster_after is not None
            else f"never within {settling.waited} s: {settling.unsettled} StatefulSets not settled"
        )
        if settling.operator_after is not None:
            results["operator_quiet_after_s"] = settling.operator_after
            if settling.cluster_after is not None:
                after = round(settling.operator_after - settling.cluster_after, 1)
                results["operator_quiet_after_the_cluster_settled_s"] = after
            print(f"the operator has been quiet for {QUIET:.0f} s, {settling.operator_after} s after the last burst; "
                  f"idle window of {args.idle_seconds:.0f} s at {total} services ...", flush=True)  # fmt: skip
            since = now_rfc3339()
            time.sleep(args.idle_seconds)
            until, seconds, label = now_rfc3339(), args.idle_seconds, "idle_requests_per_minute"
        else:
            # No idle window to measure: what it kept sending over the last minute of the wait instead.
            results["operator_quiet_after_s"] = f"never: still sending requests after {settling.waited} s"
            print(f"NOT SETTLED: the operator still sent requests after {settling.waited} s; its last 60 s follow")
            until, seconds, label = now_rfc3339(), 60.0, "not_settled_requests_per_minute_last_60s"
            since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 60)) + ".000000Z"
        time.sleep(3)  # the audit log is written in batches
        breakdown = audit_breakdown(audit_files(state / "logs"), since, until, seconds)
        results[label] = {"services": total, **breakdown}
        results["rss_mb"]["idle at the end"] = rss = rss_mb(operator.pid)
        results["rss_mb"]["peak"] = rss_mb(operator.pid, "VmHWM")
        results["rss_mb_per_1000_pods"]["idle at the end"] = per_thousand_pods(rss, results["rss_mb"]["idle"], total)
        results["pods_ready_at_the_end"] = ready_pods(api)
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(30)
        devcluster.down(state)
        if files := audit_files(state / "logs"):
            print(f"audit log kept as {keep_audit_log(files)}")
    report(results)
    shutil.rmtree(state, ignore_errors=True)
    return 0


def report(results: dict[str, Any], prefix: str = "", hidden: tuple[str, ...] = ()) -> None:
    """Prints ``results`` as a table beside the previous run's, and keeps them as ``<prefix>last.json``
    (``hidden`` keys too, which the table leaves out: the details behind its figures)."""
    last, previous = OUT / f"{prefix}last.json", OUT / f"{prefix}previous.json"
    before = json.loads(last.read_text()) if last.exists() else None
    if last.exists():
        last.replace(previous)
    last.write_text(json.dumps(results, indent=2, default=str))
    shown = {k: v for k, v in results.items() if k not in hidden}
    rows = _rows(shown)
    old = dict(_rows({k: v for k, v in before.items() if k not in hidden})) if before else {}
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
