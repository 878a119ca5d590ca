"""`make bench-autoscaling`: two reading workloads under each autoscaling mode, on kind, runs interleaved.

On `make kind-up`'s cluster (a real kubelet, metrics-server, the operator installed by the chart;
``TFDATA_KIND_CLUSTER`` names another one), each run in a namespace of its own:

- TFData: examples/autoscaling.yaml as written (the operator scales on the dispatcher's signals;
  scaleDown WhenIdle);
- CPU: the same service with ``metric: CPU`` (a HorizontalPodAutoscaler on metrics-server's readings);
- TFData-Always (only with ``--modes``): the example with ``scaleDown: Always`` (workers may be
  removed while clients read: DYNAMIC's at-most-once splits can then drop elements, which this counts).

The workers request the same CPU in every mode, ``--worker-cpu`` (200m: the most at which all 4 of
``maxReplicas`` can be scheduled on the 2-core kind node beside the control plane, metrics-server,
the operator, the dispatcher and the trainer). The HPA needs a request, both autoscalers read CPU as
used over requested, and a request does not cap what a worker uses. (Until issue 24 the CPU mode's
workers requested 100m and the TFData mode's 250m: the HPA then read about 10x its target and went
from 1 to 4 workers at once, and that choice, not the mode, made much of the worker-seconds.)

The workloads, each read by one trainer pod (the server image, the client helper found through
``envFrom``, reporting through ``iterate()``) as fast as it can:

- CPU-heavy: ``--elements`` (6000) elements of a map of ``--burn`` 256x256 matmuls each. The needed
  workers, ``--needed`` (2), are what a 2-core kind node can feed: one worker per core (more workers
  share the same two cores; both autoscalers still go to 4, docs/autoscaling.md). On a bigger node,
  pass the count its cores can feed;
- I/O-bound: ``--io-elements`` (3000) elements that each wait ``--sleep-ms`` (40) in the worker, as a read
  from a bucket does, at almost no CPU (TensorFlow's SleepDataset: a graph op, so it runs in the
  workers, where a py_function cannot). Each worker waits on its own elements, so every worker up to
  ``maxReplicas`` adds as much: ``--io-needed`` (4). The HPA should never scale it (the workers' CPU
  stays low); TFData adds workers as a trial, kept only if the trainer reads faster.

Runs alternate: round 1 runs every workload under each mode, then round 2, for ``--runs`` (3)
rounds, and each round starts with the next mode (TFData, CPU; then CPU, TFData; ...), so that the
machine's noise falls on both modes and neither always runs first (about 45 minutes on 2 cores).
``--quick`` is one short round, for development: 3000 and 1000 elements, a 30 s tail.
``--end-by HH:MM`` (UTC) starts no run that would end later than that, judged by the longest run of
its workload so far, and the JSON says what ran.

Each run starts from one Ready worker with its signal flowing (the HPA has a CPU reading, the
operator a signals reading), then runs the trainer, which reads every element of a range and checks
it, and keeps watching for ``--tail`` (90) seconds after the read. Per run:

- the seconds from the trainer's first element to the needed ready workers (and to the most);
- the trainer's throughput over the whole read;
- worker-seconds: worker pods that existed (the StatefulSet's replicas, running or starting), summed
  over the read and over the read plus the tail;
- elements lost and read twice;
- the workers' CPU as the mode's autoscaler read it, used over requested: the HPA's average
  utilization, or the operator's ``status.autoscaling.signals.workerCPUPercent`` (the status keeps a
  reading when the count changes and otherwise at most every 30 s), median and most while reading.

The goal (issue 9): TFData reaches the needed workers at least 2x sooner than CPU, with equal or
fewer worker-seconds. It prints, per workload, each figure's median over the runs with the smallest
and largest value (``never in k`` when a count was not reached in k runs), CPU over TFData for the
time to the needed workers and TFData over CPU for the worker-seconds while reading (from the
medians), each ratio with its n: the runs of each mode its medians are over, of the runs done, and
how many never reached the count or failed (those have no figure to take the median of). It writes
.local/bench/autoscaling-last.json (every run's figures, scale Events and place in its round; the
summary, each ratio's n under the ratio's key with ", n" added; the previous run's file kept as
autoscaling-previous.json and its summary printed beside), and each run's Events as
autoscaling-<workload>-<mode>-<run>-events.txt. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from bench import OUT, in_turn, now_rfc3339, report

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "autoscaling.yaml"
VERSION = next(
    line.split('"')[1] for line in (ROOT / "operator" / "pyproject.toml").read_text().splitlines()
    if line.startswith("version = ")
)  # fmt: skip
SERVER_IMAGE = f"tfdata-server:{VERSION}"  # kind/cluster.sh loads it
MODES = ("TFData", "CPU", "TFData-Always")
DEFAULT_MODES = ("TFData", "CPU")
WORKLOADS = ("cpu-heavy", "io-bound")
TITLES = {"cpu-heavy": "CPU-heavy", "io-bound": "I/O-bound"}
# The workers' CPU request in every mode: the most that lets maxReplicas (4) workers be scheduled on
# the 2-core kind node beside what is already there (the control plane, metrics-server and the
# operator request 1,050m; the dispatcher 100m, the trainer 10m): 4 x 200m of the 840m left.
WORKER_CPU = "200m"
# (full, --quick) defaults of the options that set a run's length.
LENGTHS = {"runs": (3, 1), "elements": (6000, 3000), "io_elements": (3000, 1000), "tail": (90.0, 30.0)}

# The trainer: every element of range(count), through a map that burns CPU in the workers or a wait
# there (or both), read through the client helper (settings from the service's ConfigMap, by
# envFrom) as fast as the loop can take them; iterate() reports its stalls and element rate. It
# prints progress, then one RESULT line: when it read what, and what it lost.
TRAINER = """
import collections, json, sys, time
import tensorflow as tf
from tfdata_operator import client
name, count, burn, sleep_us = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dataset = tf.data.Dataset.range(count)
if burn:
    matrix = tf.random.stateless_uniform([256, 256], seed=[1, 2]) / 256.0
    def heavy(i):
        start = matrix + tf.cast(i, tf.float32) * 1e-9
        _, product = tf.while_loop(lambda k, m: k < burn, lambda k, m: (k + 1, tf.matmul(m, matrix)), [0, start])
        return tf.cond(tf.reduce_sum(product) > -1e30, lambda: i, lambda: i + 1)
    dataset = dataset.map(heavy)
if sleep_us:
    # tf.data.experimental has no public sleep; SleepDataset is a graph op, so it runs in the workers.
    from tensorflow.python.data.experimental.ops import testing
    dataset = dataset.apply(testing.sleep(sleep_us))
dataset = dataset.apply(client.distribute(name))
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


@dataclasses.dataclass(frozen=True)
class Workload:
    key: str
    elements: int
    burn: int  # 256x256 matmuls per element
    sleep_ms: int  # wait per element
    needed: int  # the worker count the load can use

    @property
    def title(self) -> str:
        return TITLES[self.key]

    def describe(self) -> str:
        what = f"{self.burn} 256x256 matmuls" if self.burn else f"a {self.sleep_ms} ms wait, almost no CPU"
        return f"{self.elements} elements, each {what}; needed workers: {self.needed}"


@dataclasses.dataclass(frozen=True)
class Sample:
    """One look at the service, once a second."""

    t: float
    replicas: int  # spec.workers.replicas: what the autoscaler asks for
    pods: int  # the StatefulSet's worker pods, running or starting
    ready: int
    cpu: float | None  # the workers' CPU % of request, as the mode's autoscaler read it


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


def service(mode: str, namespace: str, worker_cpu: str) -> dict[str, Any]:
    """examples/autoscaling.yaml with the workers' CPU request, changed only as the mode says."""
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["namespace"] = namespace
    body["spec"]["workers"]["resources"] = {"requests": {"cpu": worker_cpu}}  # the same in every mode
    if mode == "CPU":
        body["spec"]["autoscaling"]["metric"] = "CPU"
        body["spec"]["autoscaling"].pop("targetDataStallPercentage")
        body["spec"]["autoscaling"].pop("scaleDown")  # an HPA removes workers whenever it wants (Always)
    elif mode == "TFData-Always":
        body["spec"]["autoscaling"]["scaleDown"] = "Always"
    return dict(body)


def trainer_pod(name: str, namespace: str, workload: Workload) -> dict[str, Any]:
    argv = [name, str(workload.elements), str(workload.burn), str(workload.sleep_ms * 1000)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": namespace, "labels": {"tfdata.dev/client": name}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "trainer", "image": SERVER_IMAGE, "imagePullPolicy": "Never",
                "command": ["python3", "-c", TRAINER, *argv],
                "envFrom": [{"configMapRef": {"name": f"{name}-client"}}],
                "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
            }],
        },
    }  # fmt: skip


def look(kind: Kind, mode: str, name: str, namespace: str) -> tuple[Sample, str]:
    """The service, its workers' StatefulSet, the trainer (and the HPA) in one request: a sample and
    the trainer's phase."""
    objects = [f"tfdata/{name}", f"statefulset/{name}-worker", "pod/trainer"]
    if mode == "CPU":
        objects.append(f"horizontalpodautoscaler/{name}-worker")
    out = kind.run("get", *objects, "-n", namespace, "-o", "json", check=False)
    items = {item["kind"]: item for item in json.loads(out or '{"items": []}').get("items", [])}
    svc, sts = items.get("TFDataService", {}), items.get("StatefulSet", {}).get("status", {})
    if mode == "CPU":
        metrics = items.get("HorizontalPodAutoscaler", {}).get("status", {}).get("currentMetrics") or [{}]
        cpu = ((metrics[0].get("resource") or {}).get("current") or {}).get("averageUtilization")
    else:
        cpu = ((svc.get("status", {}).get("autoscaling") or {}).get("signals") or {}).get("workerCPUPercent")
    sample = Sample(
        time.time(), int(svc.get("spec", {}).get("workers", {}).get("replicas", 0)), int(sts.get("replicas", 0)),
        int(sts.get("readyReplicas", 0)), None if cpu is None else float(cpu),
    )  # fmt: skip
    return sample, items.get("Pod", {}).get("status", {}).get("phase", "")


def schedule(rounds: int, workloads: list[Workload], modes: list[str]) -> list[tuple[int, Workload, str, int]]:
    """The runs in the order they run: (round from 1, workload, mode, its place in the round among the
    workload's modes). Each round runs every workload under each mode, and starts with the next mode
    (TFData, CPU; CPU, TFData; ...), so that neither always runs first."""
    return [
        (run, workload, mode, place)
        for run in range(1, rounds + 1)
        for workload in workloads
        for place, mode in enumerate(in_turn(modes, run - 1), 1)
    ]


def run_one(kind: Kind, workload: Workload, mode: str, run: int, args: argparse.Namespace) -> dict[str, Any]:
    label = f"{workload.key}-{mode.lower()}-{run}"
    namespace = f"bench-autoscaling-{label}"  # a new one each run: nothing the operator remembers carries over
    kind.run("delete", "namespace", namespace, "--ignore-not-found", "--wait=true", timeout=300)
    kind.run("create", "namespace", namespace)
    body = service(mode, namespace, args.worker_cpu)
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

        kind.apply(trainer_pod(name, namespace, workload))
        timeline: list[Sample] = []
        phase, ended = "", None
        while ended is None or time.time() < ended + args.tail:
            sample, now_phase = look(kind, mode, name, namespace)
            timeline.append(sample)
            if ended is None:
                phase = now_phase
                if phase in ("Succeeded", "Failed"):
                    ended = time.time()
                elif time.time() - timeline[0].t > args.timeout + workload.elements:
                    raise SystemExit(f"{label}: the trainer did not finish; saw:\n{describe()}")
            time.sleep(1)
        log = kind.run("logs", "trainer", "-n", namespace)
        if phase != "Succeeded" or "RESULT " not in log:
            raise SystemExit(f"{label}: the trainer ended {phase}:\n{log[-3000:]}")
        read = json.loads(log[log.index("RESULT ") + len("RESULT ") :].splitlines()[0])
        columns = "custom-columns=REASON:.reason,FROM:.source.component,MESSAGE:.message"
        events = kind.run("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", "-o", columns, check=False)
        scales = [" ".join(line.split()) for line in events.splitlines() if "Scaled" in line or "Rescale" in line]
        for line in scales:
            print(f"  {line}")
        (OUT / f"autoscaling-{label}-events.txt").write_text(events)
        return {**figures(read, timeline, workload.needed, args.tail), "scale events": scales}
    finally:
        kind.run("delete", "namespace", namespace, "--wait=true", timeout=300, check=False)


def figures(read: dict[str, Any], timeline: list[Sample], needed: int, tail: float) -> dict[str, Any]:
    first, last = float(read["first"]), float(read["last"])
    end = timeline[-1].t

    def seconds_to(count: int) -> float | None:
        return next((round(s.t - first, 1) for s in timeline if s.ready >= count and s.t >= first), None)

    def worker_seconds(until: float) -> float:
        total = 0.0
        for a, b in itertools.pairwise(timeline):
            total += a.pods * max(0.0, min(b.t, until) - max(a.t, first))
        return round(total, 1)

    reading = [s for s in timeline if first <= s.t <= last]
    most = max(s.ready for s in reading)
    cpu = [s.cpu for s in reading if s.cpu is not None]
    changes = [(round(s.t - first), s.replicas) for i, s in enumerate(timeline)
               if i == 0 or s.replicas != timeline[i - 1].replicas]  # fmt: skip
    return {
        f"s to {needed} ready workers": seconds_to(needed),
        "most ready workers while reading": most,
        "s to the most": seconds_to(most),
        "elements/s": round(int(read["read"]) / max(last - first, 1e-9), 1),
        "read s": round(last - first, 1),
        "worker-s while reading": worker_seconds(last),
        f"worker-s incl. {tail:.0f} s after": worker_seconds(end),
        "elements lost": int(read["lost"]),
        "elements read twice": int(read["repeated"]),
        "workers' CPU % of request, median while reading": round(statistics.median(cpu)) if cpu else None,
        "workers' CPU % of request, most while reading": round(max(cpu)) if cpu else None,
        "replicas (s from first element, count)": " ".join(f"{s}:{r}" for s, r in changes),
    }


def spread(values: list[Any]) -> str:
    """A figure over the runs: its median (smallest-largest); runs that never got there are counted."""
    numbers = [v for v in values if isinstance(v, int | float)]
    never = len(values) - len(numbers)
    if not numbers:
        return f"never in {never}" if never else "-"
    text = f"{statistics.median(numbers):g}"
    if len(numbers) > 1:
        text += f" ({min(numbers):g}-{max(numbers):g})"
    return text + (f", never in {never}" if never else "")


def summarize(runs: list[dict[str, Any]], workloads: list[Workload], modes: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for workload in workloads:
        per_mode: dict[str, Any] = {}
        medians: dict[str, dict[str, float]] = {}
        for mode in modes:
            done = [r for r in runs if r["workload"] == workload.key and r["mode"] == mode]
            good = [r["figures"] for r in done if "figures" in r]
            if not done:
                continue
            keys = [k for k, v in good[0].items() if not isinstance(v, str | list)] if good else []
            per_mode[mode] = {"runs": f"{len(good)} of {len(done)}" if len(good) < len(done) else len(good)}
            per_mode[mode] |= {key: spread([f[key] for f in good]) for key in keys}
            medians[mode] = {
                key: statistics.median(numbers)
                for key in keys
                if (numbers := [f[key] for f in good if isinstance(f[key], int | float)])
            }
        needed, ws = f"s to {workload.needed} ready workers", "worker-s while reading"
        tfdata, cpu = medians.get("TFData", {}), medians.get("CPU", {})
        if "TFData" in per_mode and "CPU" in per_mode:
            mine = [r for r in runs if r["workload"] == workload.key]
            key = f"CPU over TFData, {needed} (medians)"
            per_mode[key] = round(cpu[needed] / tfdata[needed], 2) if needed in cpu and needed in tfdata else "-"
            per_mode[f"{key}, n"] = ratio_n(mine, needed, ("CPU", "TFData"))
            key = f"TFData over CPU, {ws} (medians)"
            per_mode[key] = round(tfdata[ws] / cpu[ws], 2) if ws in cpu and ws in tfdata else "-"
            per_mode[f"{key}, n"] = ratio_n(mine, ws, ("TFData", "CPU"))
        summary[workload.title] = per_mode
    return summary


def ratio_n(runs: list[dict[str, Any]], key: str, modes: tuple[str, ...]) -> str:
    """How many runs of each mode a ratio of medians of ``key`` is over, of the runs done, and why the
    others are not in it: ``TFData 3 of 3, CPU 1 of 3 (never in 2)``."""
    parts = []
    for mode in modes:
        done = [r for r in runs if r["mode"] == mode]
        good = [r["figures"] for r in done if "figures" in r]
        numbers = [f for f in good if isinstance(f.get(key), int | float)]
        why = [f"never in {len(good) - len(numbers)}" if len(good) > len(numbers) else "",
               f"failed {len(done) - len(good)}" if len(done) > len(good) else ""]  # fmt: skip
        reasons = ", ".join(w for w in why if w)
        parts.append(f"{mode} {len(numbers)} of {len(done)}" + (f" ({reasons})" if reasons else ""))
    return ", ".join(parts)


def print_tables(
    summary: dict[str, Any], workloads: list[Workload], modes: list[str], args: argparse.Namespace
) -> None:
    for workload in workloads:
        table = summary.get(workload.title) or {}
        columns = [m for m in modes if m in table]
        if not columns:
            continue
        figures = list(dict.fromkeys(k for m in columns for k in table[m]))
        width = max(len(k) for k in figures)
        cells = [max(len(m), *(len(str(table[m].get(k, "-"))) for k in figures)) for m in columns]
        print(f"\n{workload.title}: {workload.describe()}; workers request {args.worker_cpu} CPU in every mode; "
              "median (smallest-largest) over the runs")  # fmt: skip
        print("  ".join(["figure".ljust(width), *(m.rjust(c) for m, c in zip(columns, cells, strict=True))]))
        for key in figures:
            values = (str(table[m].get(key, "-")).rjust(c) for m, c in zip(columns, cells, strict=True))
            print("  ".join([key.ljust(width), *values]))
        for key, value in table.items():
            if key in MODES or (key.endswith(", n") and key.removesuffix(", n") in table):
                continue  # a mode's column, or a ratio's n: printed beside its ratio
            n = table.get(f"{key}, n")
            print(f"{key}: {value}" + (f"; n: {n}" if n else ""))


def end_by(text: str) -> float:
    """``HH:MM`` (UTC, today) as a time.time()."""
    hours, minutes = (int(part) for part in text.split(":"))
    now = datetime.datetime.now(datetime.UTC)
    return now.replace(hour=hours, minute=minutes, second=0, microsecond=0).timestamp()


def default_kubeconfig() -> Path:
    """kind/cluster.sh's: .local/kind-kubeconfig for its default cluster, else one named after the cluster."""
    cluster = os.environ.get("TFDATA_KIND_CLUSTER", "tfdata")
    return ROOT / ".local" / ("kind-kubeconfig" if cluster == "tfdata" else f"kind-{cluster}-kubeconfig")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, default=default_kubeconfig())
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, from {', '.join(MODES)}")
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"comma-separated, from {', '.join(WORKLOADS)}"
    )
    parser.add_argument("--quick", action="store_true", help="one short round, for development (see the defaults)")
    parser.add_argument("--runs", type=int, help="rounds of every workload and mode (3; --quick 1)")
    parser.add_argument("--worker-cpu", default=WORKER_CPU, help="the workers' CPU request, the same in every mode")
    parser.add_argument("--elements", type=int, help="CPU-heavy: elements the trainer reads (6000; --quick 3000)")
    parser.add_argument("--burn", type=int, default=60, help="CPU-heavy: 256x256 matmuls per element in the workers")
    parser.add_argument("--needed", type=int, default=2, help="CPU-heavy: the worker count the load can use")
    parser.add_argument("--io-elements", type=int, help="I/O-bound: elements the trainer reads (3000; --quick 1000)")
    parser.add_argument("--sleep-ms", type=int, default=40, help="I/O-bound: each element's wait in the worker")
    parser.add_argument("--io-needed", type=int, default=4, help="I/O-bound: the worker count the load can use")
    parser.add_argument("--tail", type=float, help="seconds watched after the read (90; --quick 30)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for Ready and first readings")
    parser.add_argument("--end-by", metavar="HH:MM", help="UTC: start no run that would end later")
    args = parser.parse_args()
    for option, (full, quick) in LENGTHS.items():
        if getattr(args, option) is None:
            setattr(args, option, quick if args.quick else full)
    modes, keys = args.modes.split(","), args.workloads.split(",")
    if unknown := sorted(set(modes) - set(MODES)):
        parser.error(f"unknown mode(s) {', '.join(unknown)}: choose from {', '.join(MODES)}")
    if unknown := sorted(set(keys) - set(WORKLOADS)):
        parser.error(f"unknown workload(s) {', '.join(unknown)}: choose from {', '.join(WORKLOADS)}")
    if not args.kubeconfig.exists():
        parser.error(f"no kind cluster: {args.kubeconfig} is missing (run `make kind-up`)")
    deadline = end_by(args.end_by) if args.end_by else None
    workloads = [
        Workload(key, args.elements, args.burn, 0, args.needed)
        if key == "cpu-heavy"
        else Workload(key, args.io_elements, 0, args.sleep_ms, args.io_needed)
        for key in keys
    ]
    kind = Kind(args.kubectl, args.kubeconfig)
    node = kind.json("get", "nodes")["items"]
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "when": now_rfc3339(), "cpus": os.cpu_count(),
        "nodes (allocatable CPU)": ", ".join(n["status"]["allocatable"]["cpu"] for n in node),
        "worker CPU request": args.worker_cpu, "runs asked": args.runs, "tail s": args.tail,
        "order": "each round starts with the next mode (A B, B A, ...)",
        "workloads": {w.title: w.describe() for w in workloads},
    }  # fmt: skip
    runs: list[dict[str, Any]] = []
    longest: dict[str, float] = {}
    stopped = None
    for run, workload, mode, place in schedule(args.runs, workloads, modes):
        if deadline and time.time() + longest.get(workload.key, 0) > deadline:
            stopped = f"before run {run} of {workload.title} {mode}: it would end after {args.end_by} UTC"
            print(f"stopped {stopped}", flush=True)
            break
        print(f"{workload.title} {mode}, run {run} ({place} of {len(modes)} in its round) ...", flush=True)
        started = time.time()
        entry: dict[str, Any] = {"workload": workload.key, "mode": mode, "run": run, "place in round": place,
                                 "started": now_rfc3339(), "load average": os.getloadavg()[0]}  # fmt: skip
        try:
            entry["figures"] = run_one(kind, workload, mode, run, args)
        except SystemExit as exc:  # one run's failure is a figure too; the others still run
            entry["error"] = str(exc)
        entry["s"] = round(time.time() - started)
        longest[workload.key] = max(longest.get(workload.key, 0), entry["s"])
        runs.append(entry)
        print(json.dumps(entry.get("figures") or entry, indent=2), flush=True)
    if stopped:
        results["stopped"] = stopped
    results["summary"] = summary = summarize(runs, workloads, modes)
    results["runs"] = runs
    print_tables(summary, workloads, modes, args)
    report(results, "autoscaling-", hidden=("runs", "workloads"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
