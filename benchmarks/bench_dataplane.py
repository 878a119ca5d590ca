"""`make bench-dataplane`: the tf.data service's data plane, with real TensorFlow servers on 127.0.0.1.

No Kubernetes: ``tfdata-server dispatcher`` and ``tfdata-server worker`` run as processes here (as
in tests/server), and one trainer process reads through them with the client helper's
``distribute()`` (``check_servers=False``; TensorFlow's defaults otherwise, unless a part says).
The trainer is pinned to CPU 0, every dispatcher and worker (supervisor and TensorFlow process) to
CPU 1, so neither steals the other's CPU (``--no-pin``: no pinning; on one CPU nothing is pinned).

- cost: elements/s and the time of each ``next()`` (median, p90) of ``from_tensors(payload).repeat()``
  with payloads of 100 B, 10 KB and 1 MB of random bytes, read through one worker (sharding OFF,
  compression AUTO: what ``distribute()`` sends by default) and the same pipeline read in the
  trainer's own process (on its one CPU), as a ratio;
- scale-out: ``range().apply(sleep)``, each element waiting ``--sleep-ms`` (20) and costing almost
  no CPU, read through 1, 2, 4 and 8 workers (sharding OFF: no split request to the dispatcher per
  element); efficiency = rate(N) / (N x rate(1)), with each ``max_outstanding_requests`` of
  ``--outstanding``: TensorFlow's default (AUTOTUNE, which its client sets to the number of tasks,
  one per worker), 64, and 2 (a limit a user might set to bound memory). TensorFlow's client never
  has more than one request in flight per worker (``data_service_client.cc``, ``Task::in_use``), so
  a larger value cannot add any, and a smaller one caps the read at that many workers;
- compression: ``AUTO`` (snappy on this TensorFlow) against ``None`` for 1 MB elements of zeros,
  of repeated English text and of random bytes, through one worker: elements/s and the bytes the
  trainer received from the worker, per element (TCP payload, from the kernel's ``bytes_received``
  of the trainer's sockets to the worker's port, as ``ss -ti`` shows them: gRPC framing included).

Every point runs ``--runs`` times, the variants interleaved (A B A B ...), so the noise of this
shared machine falls on all of them; the tables show median (min-max), and ratios are of medians
of the same run. The scale-out curve is drawn against the physical line N x rate(1) into
docs/img/dataplane-scaleout.png. Writes .local/bench/dataplane-last.json (the previous run's kept as
dataplane-previous.json). ``--quick``: one short run of each point, the curve drawn into .local/bench
instead. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench import OUT, now_rfc3339
from bench_heartbeat import SERVER_BIN, free_ports, probe

from tfdata_operator.wire import serverconfig

ROOT = Path(__file__).resolve().parents[1]
PNG = ROOT / "docs" / "img" / "dataplane-scaleout.png"
CLIENT_CPU, SERVER_CPU = 0, 1
SIZES = {"100 B": 100, "10 KB": 10_000, "1 MB": 1_000_000}
DATA = ("zeros", "text", "random")
WORKER_COUNTS = (1, 2, 4, 8)
DEFAULT = "AUTOTUNE (default)"

# The trainer: one process that imports TensorFlow once and answers one JSON request per stdin line
# with one JSON line: it reads a pipeline (in process, or through the service) for a warm-up, then
# for a window, timing each next(), and counts the bytes its sockets received from the worker ports.
TRAINER = textwrap.dedent(
    """
    import json, statistics, subprocess, sys, time
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing
    from tfdata_operator import client

    TEXT = b"The quick brown fox jumps over the lazy dog; tf.data reads it again and again. "

    def payload(kind, size):
        if kind == "zeros":
            return tf.zeros([size], tf.uint8)
        if kind == "text":
            return tf.constant(np.frombuffer((TEXT * (size // len(TEXT) + 1))[:size], np.uint8))
        return tf.constant(np.random.default_rng(size).integers(0, 256, size, np.uint8))

    def received(ports):
        # bytes_received of every established TCP socket to one of `ports`, by local port.
        out = subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True, text=True).stdout
        total, peer = {}, None
        for line in out.splitlines():
            if not line[:1].isspace():
                fields = line.split()
                peer = fields[-1] if len(fields) >= 4 else None
                local = fields[-2] if len(fields) >= 4 else None
                continue
            if peer and int(peer.rsplit(":", 1)[1]) in ports:
                for field in line.split():
                    if field.startswith("bytes_received:"):
                        total[local] = int(field.split(":")[1])
        return total

    def read(req):
        if req["pipeline"] == "sleep":
            dataset = tf.data.Dataset.range(10**9).apply(testing.sleep(int(req["sleep_ms"] * 1000)))
        else:
            dataset = tf.data.Dataset.from_tensors(payload(req["data"], req["bytes"])).repeat()
        if req["address"]:
            kwargs = {"compression": req["compression"]}
            if req.get("max_outstanding_requests"):
                kwargs["max_outstanding_requests"] = req["max_outstanding_requests"]
            dataset = dataset.apply(client.distribute(
                address=req["address"], sharding_policy=req["sharding"], check_servers=False, **kwargs))
        iterator = iter(dataset)
        ports = set(req["worker_ports"])
        start = time.perf_counter()
        while time.perf_counter() - start < req["warmup"]:
            next(iterator)
        before = received(ports)
        gaps = []
        start = last = time.perf_counter()
        while last - start < req["seconds"]:
            next(iterator)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
        after = received(ports)
        del iterator
        gaps.sort()
        return {
            "elements": len(gaps), "seconds": last - start,
            "median_us": statistics.median(gaps) * 1e6, "p90_us": gaps[int(0.9 * (len(gaps) - 1))] * 1e6,
            "bytes": sum(after[k] - before.get(k, 0) for k in after),
        }

    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps(read(json.loads(line))), flush=True)
    """
)


def pinned(cpu: int | None) -> Callable[[], None] | None:
    """A preexec_fn that pins the process (and all it starts) to ``cpu``."""
    return None if cpu is None else lambda: os.sched_setaffinity(0, {cpu})


@dataclass
class Cluster:
    """One dispatcher and its workers, each a ``tfdata-server`` process."""

    address: str
    worker_ports: list[int]
    processes: list[tuple[subprocess.Popen[bytes], int, IO[bytes]]]  # (process, health port, log)

    def wait_ready(self, timeout: float) -> None:
        """Until every worker is registered and the dispatcher counts them all; exits with what it saw."""
        deadline = time.monotonic() + timeout
        (_, dispatcher_health, _), *workers = self.processes
        wanted = [(health, "registered with dispatcher") for _, health, _ in workers]
        wanted.append((dispatcher_health, f"; {len(workers)} workers registered"))
        for (process, _, log), (health, text) in zip([*workers, self.processes[0]], wanted, strict=True):
            while text not in (seen := probe(health)):
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise SystemExit(f"a server did not get ready ({seen}):\n{log.read().decode(errors='replace')}")
                time.sleep(0.5)


@contextmanager
def cluster(
    workers: int,
    cpu: int | None,
    sharding: str,
    dispatcher_options: Mapping[str, Any] | None = None,
    worker_options: Mapping[str, Any] | None = None,
) -> Iterator[Cluster]:
    """A dispatcher and ``workers`` workers on 127.0.0.1, pinned to ``cpu``; stopped on exit. The
    options are more fields of their ``serverconfig`` (a fault-tolerant ``work_dir``, a heartbeat)."""
    dispatcher_port, dispatcher_health, *ports = free_ports(2 + 2 * workers)
    worker_ports, worker_health = ports[:workers], ports[workers:]
    dispatcher = serverconfig.DispatcherServerConfig(
        port=dispatcher_port,
        health_port=dispatcher_health,
        worker_addresses=None if sharding in ("OFF", "DYNAMIC") else tuple(f"127.0.0.1:{p}" for p in worker_ports),
        **(dispatcher_options or {}),
    )
    configs: list[serverconfig.ServerConfig] = [dispatcher]
    configs += [
        serverconfig.WorkerServerConfig(
            port=port,
            health_port=health,
            dispatcher_address=f"127.0.0.1:{dispatcher_port}",
            worker_address_format=f"{serverconfig.POD_NAME_PLACEHOLDER}:{port}",
            **(worker_options or {}),
        )
        for port, health in zip(worker_ports, worker_health, strict=True)
    ]
    started = Cluster(f"127.0.0.1:{dispatcher_port}", worker_ports, [])
    with ExitStack() as stack:
        for config in configs:
            kind = "dispatcher" if config is dispatcher else "worker"
            log = stack.enter_context(tempfile.TemporaryFile())
            env = {**os.environ, serverconfig.CONFIG_ENV: serverconfig.to_json(config), "TF_CPP_MIN_LOG_LEVEL": "2",
                   serverconfig.POD_NAME_ENV: "127.0.0.1"}  # fmt: skip
            process = subprocess.Popen([str(SERVER_BIN), kind], env=env, stdout=log, stderr=log, preexec_fn=pinned(cpu))
            stack.callback(stop, process)
            started.processes.append((process, config.health_port, log))
        yield started


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Trainer:
    """The trainer process (TRAINER above): one read per request."""

    def __init__(self, cpu: int | None) -> None:
        self.log = tempfile.TemporaryFile()  # noqa: SIM115  # the process's stderr until close()
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        self.process = subprocess.Popen(
            [sys.executable, "-c", TRAINER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, text=True, preexec_fn=pinned(cpu),
        )  # fmt: skip
        self._line()

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.log.seek(0)
            raise SystemExit(f"the trainer exited:\n{self.log.read().decode(errors='replace')[-5000:]}")
        return line

    def read(self, **request: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        defaults = {"address": None, "worker_ports": [], "compression": "AUTO", "sharding": "OFF"}
        self.process.stdin.write(json.dumps({**defaults, **request}) + "\n")
        self.process.stdin.flush()
        return dict(json.loads(self._line()))

    def close(self) -> None:
        stop(self.process)  # type: ignore[arg-type]
        self.log.close()


def spread(values: list[float], digits: int = 0) -> dict[str, float]:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}  # fmt: skip


def show(figure: dict[str, float], digits: int = 0) -> str:
    return f"{figure['median']:,.{digits}f} ({figure['min']:,.{digits}f}-{figure['max']:,.{digits}f})"


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    for row in [header, ["-" * w for w in widths], *rows]:
        print(
            "  ".join(
                str(cell).rjust(w) if i else str(cell).ljust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )


def rate(read: dict[str, Any]) -> float:
    return float(read["elements"] / read["seconds"])


def part_cost(trainer: Trainer, one: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    """In process against through one worker, per payload size, interleaved."""
    reads: dict[str, dict[str, list[dict[str, Any]]]] = {s: {"in process": [], "service": []} for s in SIZES}
    for run in range(args.runs):
        for label, size in SIZES.items():
            for where, address in (("in process", None), ("service", one.address)):
                reads[label][where].append(trainer.read(
                    pipeline="payload", data="random", bytes=size, address=address, worker_ports=one.worker_ports,
                    warmup=args.warmup, seconds=args.seconds))  # fmt: skip
                print(f"  cost run {run + 1}/{args.runs}: {label} {where}: {rate(reads[label][where][-1]):,.0f}/s",
                      flush=True)  # fmt: skip
    results: dict[str, Any] = {}
    for label, by_where in reads.items():
        results[label] = {where: {
            "elements/s": spread([rate(r) for r in runs]),
            "next() median us": spread([r["median_us"] for r in runs], 1),
            "next() p90 us": spread([r["p90_us"] for r in runs], 1),
        } for where, runs in by_where.items()}  # fmt: skip
        results[label]["service / in process, elements/s"] = spread(
            [rate(s) / rate(i) for s, i in zip(by_where["service"], by_where["in process"], strict=True)], 3
        )
    return results


def variants(outstanding: str) -> dict[str, dict[str, int]]:
    """``--outstanding`` as the distribute() arguments of each scale-out variant, by name."""
    return {
        DEFAULT if value == "default" else value: (
            {} if value == "default" else {"max_outstanding_requests": int(value)}
        )
        for value in outstanding.split(",")
    }


def part_scaleout(trainer: Trainer, clusters: dict[int, Cluster], args: argparse.Namespace) -> dict[str, Any]:
    """The sleep pipeline through 1..8 workers, with each ``--outstanding`` variant."""
    by_name = variants(args.outstanding)
    rates: dict[str, dict[int, list[float]]] = {v: {n: [] for n in clusters} for v in by_name}
    for run in range(args.runs):
        for n, one in clusters.items():
            for name, extra in by_name.items():
                read = trainer.read(pipeline="sleep", sleep_ms=args.sleep_ms, sharding=args.sharding,
                                    address=one.address, worker_ports=one.worker_ports, warmup=args.scaleout_warmup,
                                    seconds=args.scaleout_seconds, **extra)  # fmt: skip
                rates[name][n].append(rate(read))
                print(
                    f"  scale-out run {run + 1}/{args.runs}: {n} workers, {name}: {rate(read):,.1f}/s",
                    flush=True,
                )
    one_worker = rates[next(iter(by_name))][min(clusters)]
    results: dict[str, Any] = {
        "sleep ms": args.sleep_ms, "sharding": args.sharding,
        "physical line N x rate(1)": {n: round(n * statistics.median(one_worker), 1) for n in clusters},
        "variants": {},
    }  # fmt: skip
    for name, by_n in rates.items():
        results["variants"][name] = {
            f"{n} workers": {
                "elements/s": spread(values, 1),
                # Each run's rate over N times the same round's one-worker rate (of the same variant).
                "efficiency": spread([v / (n * o) for v, o in zip(values, by_n[min(by_n)], strict=True)], 3),
            }
            for n, values in by_n.items()
        }
    return results


def part_compression(trainer: Trainer, one: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    """AUTO against None, 1 MB elements of each kind of data, through one worker."""
    choices = {"AUTO": "AUTO", "None": None}
    reads: dict[str, dict[str, list[dict[str, Any]]]] = {d: {c: [] for c in choices} for d in DATA}
    for run in range(args.runs):
        for data in DATA:
            for label, compression in choices.items():
                read = trainer.read(pipeline="payload", data=data, bytes=SIZES["1 MB"], address=one.address,
                                    worker_ports=one.worker_ports, compression=compression, warmup=args.warmup,
                                    seconds=args.seconds)  # fmt: skip
                reads[data][label].append(read)
                print(f"  compression run {run + 1}/{args.runs}: {data} {label}: {rate(read):,.1f}/s, "
                      f"{read['bytes'] / max(read['elements'], 1):,.0f} B/element", flush=True)  # fmt: skip
    results: dict[str, Any] = {}
    for data, by_choice in reads.items():
        results[data] = {label: {
            "elements/s": spread([rate(r) for r in runs], 1),
            "bytes received per element": spread([r["bytes"] / max(r["elements"], 1) for r in runs]),
        } for label, runs in by_choice.items()}  # fmt: skip
        results[data]["AUTO / None, elements/s"] = spread(
            [rate(a) / rate(n) for a, n in zip(by_choice["AUTO"], by_choice["None"], strict=True)], 3
        )
        results[data]["AUTO / None, bytes"] = spread(
            [(a["bytes"] / a["elements"]) / (n["bytes"] / n["elements"])
             for a, n in zip(by_choice["AUTO"], by_choice["None"], strict=True)], 3)  # fmt: skip
    return results


def print_cost(results: dict[str, Any], pinning: str) -> None:
    rows = []
    for label in SIZES:
        for where in ("in process", "service"):
            figures = results[label][where]
            rows.append([label, where, show(figures["elements/s"]), show(figures["next() median us"], 1),
                         show(figures["next() p90 us"], 1)])  # fmt: skip
        rows.append(
            [label, "service / in process", show(results[label]["service / in process, elements/s"], 3), "", ""]
        )
    print_table(f"Cost of the service: random payloads, 1 worker, compression AUTO ({pinning}); median (min-max)",
                ["element", "read", "elements/s", "next() median µs", "next() p90 µs"], rows)  # fmt: skip


def print_scaleout(results: dict[str, Any]) -> None:
    rows = []
    for n, line in results["physical line N x rate(1)"].items():
        for name, figures in results["variants"].items():
            point = figures[f"{n} workers"]
            rows.append([str(n), name, f"{line:,.1f}", show(point["elements/s"], 1), show(point["efficiency"], 3)])
    title = (
        f"Scale-out: each element sleeps {results['sleep ms']:g} ms in its worker, sharding {results['sharding']}; "
        "efficiency = rate(N) / (N x rate(1)); median (min-max)"
    )
    print_table(title, ["workers", "max_outstanding_requests", "N x rate(1)", "elements/s", "efficiency"], rows)


def print_compression(results: dict[str, Any]) -> None:
    rows = []
    for data in DATA:
        for label in ("AUTO", "None"):
            figures = results[data][label]
            rows.append([data, label, show(figures["elements/s"], 1), show(figures["bytes received per element"])])
        rows.append([data, "AUTO / None", show(results[data]["AUTO / None, elements/s"], 3),
                     show(results[data]["AUTO / None, bytes"], 3)])  # fmt: skip
    print_table("Compression: 1 MB elements, 1 worker; bytes the trainer received from the worker (TCP payload, "
                "ss -ti bytes_received); median (min-max)",
                ["data", "compression", "elements/s", "bytes per element"], rows)  # fmt: skip


def draw(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    line = results["physical line N x rate(1)"]
    counts = list(line)
    figure, axes = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    axes.plot(counts, list(line.values()), "k--", label="physical line: N x rate(1 worker)")
    for name, figures in results["variants"].items():
        points = [figures[f"{n} workers"]["elements/s"] for n in counts]
        median = [p["median"] for p in points]
        below = [m - p["min"] for m, p in zip(median, points, strict=True)]
        above = [p["max"] - m for m, p in zip(median, points, strict=True)]
        axes.errorbar(
            counts, median, yerr=[below, above], fmt="o-", capsize=3, label=f"max_outstanding_requests {name}"
        )
    axes.set_xlabel("workers")
    axes.set_ylabel("elements/s (median; bars: min-max)")
    axes.set_xticks(counts)
    axes.set_title(f"tf.data service scale-out, {results['sleep ms']:g} ms per element, sharding {results['sharding']}")
    axes.legend(fontsize="small")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    print(f"\ndrew {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="cost,scaleout,compression", help="comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="runs of each point, interleaved")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds read before each window")
    parser.add_argument("--seconds", type=float, default=3.0, help="the window of each cost and compression point")
    parser.add_argument("--sleep-ms", type=float, default=20.0, help="the scale-out pipeline's wait per element")
    parser.add_argument("--workers", default=",".join(map(str, WORKER_COUNTS)), help="scale-out worker counts")
    parser.add_argument("--scaleout-warmup", type=float, default=2.0, help="seconds read before each window")
    parser.add_argument("--scaleout-seconds", type=float, default=6.0, help="the window of each scale-out point")
    parser.add_argument("--sharding", default="OFF", help="the scale-out's sharding policy (OFF or DYNAMIC)")
    parser.add_argument(
        "--outstanding", default="default,64,2",
        help="the scale-out's variants: max_outstanding_requests values, 'default' for TensorFlow's (AUTOTUNE)",
    )  # fmt: skip
    parser.add_argument("--no-pin", action="store_true", help="leave the processes on every CPU")
    parser.add_argument("--png", type=Path, help=f"where to draw the scale-out curve (default {PNG.relative_to(ROOT)})")
    parser.add_argument("--quick", action="store_true", help="one short run of each point, for development")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.warmup, args.seconds, args.scaleout_warmup, args.scaleout_seconds = 1, 0.5, 1.0, 1.5, 2.0
        args.png = args.png or OUT / "dataplane-scaleout-quick.png"  # the committed curve is of full runs
    parts = args.parts.split(",")
    counts = sorted({1, *map(int, args.workers.split(","))})
    pin = not args.no_pin and len(os.sched_getaffinity(0)) >= 2
    client_cpu, server_cpu = (CLIENT_CPU, SERVER_CPU) if pin else (None, None)
    pinning = (f"trainer pinned to CPU {CLIENT_CPU}, dispatchers and workers to CPU {SERVER_CPU}" if pin
               else "nothing pinned")  # fmt: skip
    print(f"{pinning}; {os.cpu_count()} CPUs; runs of each point: {args.runs}", flush=True)
    results: dict[str, Any] = {"when": now_rfc3339(), "cpus": os.cpu_count(), "pinning": pinning, "runs": args.runs}
    started = time.monotonic()
    with ExitStack() as stack:
        wanted = counts if "scaleout" in parts else [1]
        clusters = {n: stack.enter_context(cluster(n, server_cpu, "DYNAMIC")) for n in wanted}
        trainer = Trainer(client_cpu)
        stack.callback(trainer.close)
        for one in clusters.values():
            one.wait_ready(300)
        print(f"{sum(wanted)} workers and {len(wanted)} dispatchers ready after {time.monotonic() - started:.0f}s",
              flush=True)  # fmt: skip
        if "cost" in parts:
            results["cost"] = part_cost(trainer, clusters[1], args)
        if "scaleout" in parts:
            results["scale-out"] = part_scaleout(trainer, clusters, args)
        if "compression" in parts:
            results["compression"] = part_compression(trainer, clusters[1], args)
    results["seconds"] = round(time.monotonic() - started)
    if "cost" in results:
        print_cost(results["cost"], pinning)
    if "scale-out" in results:
        print_scaleout(results["scale-out"])
        draw(results["scale-out"], args.png or PNG)
    if "compression" in results:
        print_compression(results["compression"])
    print(f"\n{results['seconds']} s; written to {keep(results, 'dataplane')}")
    return 0


def keep(results: dict[str, Any], name: str) -> Path:
    """The run's JSON as ``<name>-last.json``, the one before it as ``<name>-previous.json``; the path written."""
    last, previous = OUT / f"{name}-last.json", OUT / f"{name}-previous.json"
    OUT.mkdir(parents=True, exist_ok=True)
    if last.exists():
        last.replace(previous)
    last.write_text(json.dumps(results, indent=2, default=str))
    return last


if __name__ == "__main__":
    sys.exit(main())
