"""`make bench-autoscaling`: the same reading workload under each autoscaling mode, on kind, in one run.

On `make kind-up`'s cluster (a real kubelet, metrics-server, the operator installed by the chart),
one mode after the other, each in a namespace of its own:

- TFData: examples/autoscaling.yaml exactly as written (the operator scales on the dispatcher's
  signals; scaleDown WhenIdle);
- CPU: the same service with ``metric: CPU`` and the CPU request the HorizontalPodAutoscaler needs
  (a request does not cap what a worker uses, so the workers get the same CPU in both modes);
- TFData-Always: the example with ``scaleDown: Always`` (workers may be removed while clients
  read: DYNAMIC's at-most-once splits can then drop elements, which this counts).

Each mode starts from one Ready worker with its signal flowing (the HPA has a CPU reading, the
operator a signals reading), then runs one trainer pod (the server image, the client helper found
through ``envFrom``, ``iterate()`` reporting its stalls) that reads ``--elements`` elements of a
CPU-heavy map (``--burn`` 256x256 matmuls each) as fast as it can, and keeps watching for
``--tail`` seconds after the read. For each mode it prints:

- the seconds from the trainer's first element to ``--needed`` ready workers (and to the most). The
  default, 2, is what this workload can use on a 2-core kind node: one worker per core (the
  dev-cluster e2e measured 45.8 elements/s with 1 worker and 42.7 with 4; a third worker only
  shares the same cores). On a bigger node, pass the count its cores can feed;
- the trainer's throughput over the whole read;
- worker-seconds: worker pods that existed (the StatefulSet's replicas, running or starting), summed
  over the read and over the read plus the tail;
- elements lost and read twice (the trainer checks every element of the range).

The goal (issue 9): TFData reaches the needed workers at least 2x sooner than CPU, with equal or
fewer worker-seconds. On a 2-core machine more workers cannot read faster (one worker and the
trainer already fill the CPU), so throughput is printed, not expected to rise.

Writes .local/bench/autoscaling-last.json (the previous run's kept as autoscaling-previous.json and
printed beside), and each mode's Events as autoscaling-<mode>-events.txt. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from bench import OUT, now_rfc3339, report

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "autoscaling.yaml"
VERSION = next(
    line.split('"')[1] for line in (ROOT / "operator" / "pyproject.toml").read_text().splitlines()
    if line.startswith("version = ")
)  # fmt: skip
SERVER_IMAGE = f"tfdata-server:{VERSION}"  # kind/cluster.sh loads it
MODES = ("TFData", "CPU", "TFData-Always")
# What the HorizontalPodAutoscaler needs (and the only difference of the CPU mode's workers).
CPU_REQUEST = {"requests": {"cpu": "100m"}}

# The trainer: every element of range(count) through a map that burns CPU in the workers, read
# through the client helper (settings from the service's ConfigMap, by envFrom) as fast as the
# loop can take them. It prints progress, then one RESULT line: when it read what, and what it lost.
TRAINER = """
import collections, json, sys, time
import tensorflow as tf
from tfdata_operator import client
name, count, burn = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
matrix = tf.random.stateless_uniform([256, 256], seed=[1, 2]) / 256.0
def heavy(i):
    start = matrix + tf.cast(i, tf.float32) * 1e-9
    _, product = tf.while_loop(lambda k, m: k < burn, lambda k, m: (k + 1, tf.matmul(m, matrix)), [0, start])
    return tf.cond(tf.reduce_sum(product) > -1e30, lambda: i, lambda: i + 1)
dataset = tf.data.Dataset.range(count).map(heavy).apply(client.distribute(name))
seen, times = [], []
for element in client.iterate(dataset):
    seen.append(int(element))
    times.append(time.time())
    if len(seen) % 200 == 0:
        print("read", len(seen), flush=True)
per_second = collections.Counter(int(t - times[0]) for t in times)
distinct = set(seen)
print("RESULT", json.dumps({
    "first": times[0], "last": times[-1], "read": len(seen),
    "lost": len(set(range(count)) - distinct), "repeated": len(seen) - len(distinct),
    "per_second": [per_second.get(s, 0) for s in range(int(times[-1] - times[0]) + 1)],
}), flush=True)
"""


class Kind:
    """kubectl against the kind cluster."""

    def __init__(self, kubectl: str, kubeconfig: Path) -> None:
        self.kubectl_bin, self.env = kubectl, {**os.environ, "KUBECONFIG": str(kubeconfig)}

    def run(self, *argv: str, input: str | None = None, check: bool = True, timeout: float = 120) -> str:
        result = subprocess.run(
            [self.kubectl_bin, *argv], env=self.env, input=input, text=True, capture_output=True, timeout=timeout
        )
        if check and result.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
        return result.stdout

    def json(self, *argv: str) -> dict[str, Any]:
        return dict(json.loads(self.run(*argv, "-o", "json")))

    def apply(self, body: dict[str, Any]) -> None:
        self.run("apply", "-f", "-", input=json.dumps(body))


def wait(what: str, check: Any, timeout: float, show: Any) -> Any:
    """Polls ``check()`` every second until it returns something true; exits saying what it saw."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(1)
    raise SystemExit(f"gave up after {timeout:.0f}s waiting for {what}; saw:\n{show()}")


def service(mode: str, namespace: str) -> dict[str, Any]:
    """examples/autoscaling.yaml, changed only as the mode says."""
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["namespace"] = namespace
    if mode == "CPU":
        body["spec"]["autoscaling"]["metric"] = "CPU"
        body["spec"]["autoscaling"].pop("targetDataStallPercentage")
        body["spec"]["autoscaling"].pop("scaleDown")  # an HPA removes workers whenever it wants (Always)
        body["spec"]["workers"]["resources"] = CPU_REQUEST
    elif mode == "TFData-Always":
        body["spec"]["autoscaling"]["scaleDown"] = "Always"
    return dict(body)


def trainer_pod(name: str, namespace: str, elements: int, burn: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": namespace, "labels": {"tfdata.dev/client": name}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "trainer", "image": SERVER_IMAGE, "imagePullPolicy": "Never",
                "command": ["python3", "-c", TRAINER, name, str(elements), str(burn)],
                "envFrom": [{"configMapRef": {"name": f"{name}-client"}}],
                "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
            }],
        },
    }  # fmt: skip


def run_mode(kind: Kind, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    namespace = f"bench-autoscaling-{mode.lower()}"
    kind.run("delete", "namespace", namespace, "--ignore-not-found", "--wait=true", timeout=300)
    kind.run("create", "namespace", namespace)
    body = service(mode, namespace)
    name = body["metadata"]["name"]

    def get() -> dict[str, Any]:
        return kind.json("get", f"tfdata/{name}", "-n", namespace)

    def describe() -> str:
        return kind.run("describe", f"tfdata/{name}", "hpa,pods", "-n", namespace, check=False)

    try:
        kind.apply(body)
        wait(f"{mode}: tfdata/{name} Ready with 1 worker", lambda: any(
            c["type"] == "Ready" and c["status"] == "True" for c in get().get("status", {}).get("conditions", [])
        ), args.timeout, describe)  # fmt: skip
        if mode == "CPU":
            wait("the HorizontalPodAutoscaler's first CPU reading", lambda: kind.json(
                "get", "hpa", f"{name}-worker", "-n", namespace).get("status", {}).get("currentMetrics"),
                args.timeout, describe)  # fmt: skip
        else:
            wait("the operator's first signals reading", lambda: (get()["status"].get("autoscaling") or {}).get(
                "signals"), args.timeout, describe)  # fmt: skip

        kind.apply(trainer_pod(name, namespace, args.elements, args.burn))
        timeline: list[tuple[float, int, int, int]] = []  # (time, spec replicas, worker pods, ready workers)
        phase, ended = "", None
        while ended is None or time.time() < ended + args.tail:
            sts = kind.json("get", "statefulset", f"{name}-worker", "-n", namespace)
            spec_replicas = int(get()["spec"]["workers"]["replicas"])
            st = sts.get("status", {})
            timeline.append((time.time(), spec_replicas, int(st.get("replicas", 0)), int(st.get("readyReplicas", 0))))
            if ended is None:
                phase = kind.json("get", "pod", "trainer", "-n", namespace)["status"].get("phase", "")
                if phase in ("Succeeded", "Failed"):
                    ended = time.time()
                elif time.time() - timeline[0][0] > args.timeout + args.elements:
                    raise SystemExit(f"{mode}: the trainer did not finish; saw:\n{describe()}")
            time.sleep(1)
        log = kind.run("logs", "trainer", "-n", namespace)
        if phase != "Succeeded" or "RESULT " not in log:
            raise SystemExit(f"{mode}: the trainer ended {phase}:\n{log[-3000:]}")
        read = json.loads(log[log.index("RESULT ") + len("RESULT ") :].splitlines()[0])
        columns = "custom-columns=REASON:.reason,FROM:.source.component,MESSAGE:.message"
        events = kind.run("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", "-o", columns, check=False)
        scales = [line for line in events.splitlines() if "Scaled" in line or "SuccessfulRescale" in line]
        for line in scales:
            print(f"  {line}")
        (OUT / f"autoscaling-{mode.lower()}-events.txt").write_text(events)
        return figures(mode, read, timeline, args)
    finally:
        kind.run("delete", "namespace", namespace, "--wait=true", timeout=300, check=False)


def figures(
    mode: str, read: dict[str, Any], timeline: list[tuple[float, int, int, int]], args: argparse.Namespace
) -> dict[str, Any]:
    first, last = float(read["first"]), float(read["last"])
    end = timeline[-1][0]

    def seconds_to(count: int) -> float | None:
        return next((round(t - first, 1) for t, _, _, ready in timeline if ready >= count and t >= first), None)

    def worker_seconds(until: float) -> float:
        total = 0.0
        for (t0, _, pods, _), (t1, _, _, _) in itertools.pairwise(timeline):
            lo, hi = max(t0, first), min(t1, until)
            total += pods * max(0.0, hi - lo)
        return round(total, 1)

    most = max(ready for t, _, _, ready in timeline if first <= t <= last)
    changes = [(round(t - first), replicas) for i, (t, replicas, _, _) in enumerate(timeline)
               if i == 0 or replicas != timeline[i - 1][1]]  # fmt: skip
    return {
        f"s to {args.needed} ready workers": seconds_to(args.needed),
        "most ready workers while reading": most,
        "s to the most": seconds_to(most),
        "elements/s": round(int(read["read"]) / max(last - first, 1e-9), 1),
        "read s": round(last - first, 1),
        "worker-s while reading": worker_seconds(last),
        f"worker-s incl. {args.tail:.0f} s after": worker_seconds(end),
        "elements lost": int(read["lost"]),
        "elements read twice": int(read["repeated"]),
        "replicas (s from first element, count)": " ".join(f"{s}:{r}" for s, r in changes),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, default=ROOT / ".local" / "kind-kubeconfig")
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    parser.add_argument("--elements", type=int, default=6000, help="elements the trainer reads")
    parser.add_argument("--burn", type=int, default=60, help="256x256 matmuls per element in the workers")
    parser.add_argument("--needed", type=int, default=2, help="the worker count the load needs (see above)")
    parser.add_argument("--tail", type=float, default=120, help="seconds watched after the read")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for Ready and first readings")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if unknown := sorted(set(modes) - set(MODES)):
        parser.error(f"unknown mode(s) {', '.join(unknown)}: choose from {', '.join(MODES)}")
    if not args.kubeconfig.exists():
        parser.error(f"no kind cluster: {args.kubeconfig} is missing (run `make kind-up`)")
    kind = Kind(args.kubectl, args.kubeconfig)
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"when": now_rfc3339(), "cpus": os.cpu_count(), "elements": args.elements,
                               "burn": args.burn, "needed workers": args.needed}  # fmt: skip
    for mode in modes:
        print(f"{mode} ...", flush=True)
        try:
            results[mode] = run_mode(kind, mode, args)
        except SystemExit as exc:  # one mode's failure is a figure too; the others still run
            results[mode] = {"error": str(exc)}
        print(json.dumps(results[mode], indent=2), flush=True)
    tfdata, cpu = results.get("TFData"), results.get("CPU")
    if tfdata and cpu and "error" not in tfdata and "error" not in cpu:
        key = f"s to {args.needed} ready workers"
        if tfdata[key] and cpu[key]:
            results["CPU / TFData, time to needed workers"] = round(cpu[key] / tfdata[key], 2)
        results["TFData / CPU, worker-s while reading"] = round(
            tfdata["worker-s while reading"] / cpu["worker-s while reading"], 2
        )
    report(results, "autoscaling-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
