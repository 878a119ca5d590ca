"""`make bench-dataplane`: the tf.data service's data plane, with real TensorFlow servers on 127.0.0.1.

No Kubernetes: ``tfdata-server dispatcher`` and ``tfdata-server worker`` run as processes here (as
in tests/server), and one trainer process reads through them with the client helper's
``distribute()`` (``check_servers=False``; TensorFlow's defaults otherwise, unless a part says).
The trainer (every trainer, in the trainers and cache parts) is pinned to CPU 0, every dispatcher
and worker (supervisor and TensorFlow process) to CPU 1, so neither steals the other's CPU
(``--no-pin``: no pinning; on one CPU nothing is pinned).

- cost: elements/s and the time of each ``next()`` (median, p90, mean and max) of
  ``from_tensors(payload).repeat()`` with payloads of 100 B, 10 KB and 1 MB of random bytes, read
  through one worker (sharding OFF, compression AUTO: what ``distribute()`` sends by default) and the
  same pipeline read in the trainer's own process (on its one CPU), as a ratio. The mean is 1 / the
  rate: when it is far above the median, a few slow elements set the rate (the max says how slow);
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
- trainers: 1, 2 and 4 trainer processes (all on CPU 0) reading one service of ``--trainer-workers``
  (2) workers at once, the sleep pipeline: each trainer its own job (what independent trainers
  get), and all in one job shared by ``job_name`` (sharding ``--trainers-sharding``, OFF: the job's
  elements split first-come-first-served among them), each round against the same round's rate
  of one trainer alone;
- cache: a sweep of ``--trials`` (3) trials of one CPU-heavy pipeline (``counter().map()`` of
  ``--burn`` 128x128 matmuls) on the same service, whose workers have
  ``cross_trainer_cache_size_bytes`` (``--cache-mib``): each trial its own job (every trial reads
  the whole stream; the workers compute it once per trial) against one job read as trial ``k``
  through the cross-trainer cache (``distribute(trial=k, job_name=...)``); the workers' CPU time
  (utime + stime in ``/proc/<pid>/stat`` of each worker process and its TensorFlow child) over
  trial 0's window, per second and per element a trial read.

Every point runs ``--runs`` times, the variants interleaved and each run starting with the next
one (A B, B A, A B, ...: in process and service, AUTO and None, the scale-out's and the cache's
variants, the trainers' two ways), so the noise of this shared machine falls on all of them and no
variant always reads first; the tables show median (min-max) over the runs, and each ratio is the
median of one ratio per run, of that run's reads, over every run (none is left out). The
scale-out curve is drawn against the physical line N x rate(1) into docs/img/dataplane-scaleout.png.
Writes .local/bench/dataplane-last.json (the previous run's kept as dataplane-previous.json).
``--quick``: one short run of each point, the curve drawn into .local/bench instead. ``--parts``
picks parts (``--parts trainers,cache``: the many-trainer ones alone). Figures, not pass/fail.
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

from bench import OUT, in_turn, now_rfc3339
from bench_heartbeat import SERVER_BIN, free_ports, probe

from tfdata_operator.wire import serverconfig

ROOT = Path(__file__).resolve().parents[1]
PNG = ROOT / "docs" / "img" / "dataplane-scaleout.png"
CLIENT_CPU, SERVER_CPU = 0, 1
SIZES = {"100 B": 100, "10 KB": 10_000, "1 MB": 1_000_000}
DATA = ("zeros", "text", "random")
WORKER_COUNTS = (1, 2, 4, 8)
DEFAULT = "AUTOTUNE (default)"
PARTS = ("cost", "scaleout", "compression", "trainers", "cache")

# The trainer: one process that imports TensorFlow once and answers one JSON request per stdin line
# with one JSON line: it reads a pipeline (in process, or through the service) for a warm-up, then
# for a window, timing each next(), and counts the bytes its sockets received from the worker ports.
TRAINER = textwrap.dedent(
    """
    import json, os, statistics, subprocess, sys, time
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

    def cpu_seconds(pids):
        # utime + stime of each process (all its threads), from /proc/<pid>/stat.
        total = 0
        for pid in pids:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def burn(x, matmuls):
        m = tf.random.stateless_uniform([128, 128], seed=tf.stack([x, 0]))
        for _ in range(matmuls):
            m = tf.matmul(m, m) / 128.0
        return tf.reduce_sum(m)

    def read(req):
        if req["pipeline"] == "sleep":
            dataset = tf.data.Dataset.range(10**9).apply(testing.sleep(int(req["sleep_ms"] * 1000)))
        elif req["pipeline"] == "burn":
            # Infinite, as the cross-trainer cache needs.
            dataset = tf.data.Dataset.counter().map(lambda x: burn(x, req["burn"]))
        else:
            dataset = tf.data.Dataset.from_tensors(payload(req["data"], req["bytes"])).repeat()
        if req["address"]:
            kwargs = {"compression": req["compression"]}
            if req.get("max_outstanding_requests"):
                kwargs["max_outstanding_requests"] = req["max_outstanding_requests"]
            for key in ("job_name", "trial"):
                if req.get(key) is not None:
                    kwargs[key] = req[key]
            dataset = dataset.apply(client.distribute(
                address=req["address"], sharding_policy=req["sharding"], check_servers=False, **kwargs))
        iterator = iter(dataset)
        ports = set(req["worker_ports"])
        start = time.perf_counter()
        while time.perf_counter() - start < req["warmup"]:
            next(iterator)
        before = received(ports)
        cpu_before = cpu_seconds(req.get("cpu_pids", []))
        gaps = []
        start = last = time.perf_counter()
        while last - start < req["seconds"]:
            next(iterator)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
        after = received(ports)
        cpu = cpu_seconds(req.get("cpu_pids", [])) - cpu_before
        del iterator
        gaps.sort()
        return {
            "elements": len(gaps), "seconds": last - start,
            "median_us": statistics.median(gaps) * 1e6, "p90_us": gaps[int(0.9 * (len(gaps) - 1))] * 1e6,
            # The mean is the window over the elements (1 / the rate): far above the median, a few slow
            # elements set the rate, and the max shows how slow.
            "mean_us": statistics.fmean(gaps) * 1e6, "max_us": gaps[-1] * 1e6,
            "bytes": sum(after[k] - before.get(k, 0) for k in after), "cpu_seconds": cpu,
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
    """The trainer process (TRAINER above): one read per request. ``wait=False``: started, not waited
    for (``wait_ready()`` then), so that several trainers import TensorFlow at once."""

    def __init__(self, cpu: int | None, wait: bool = True) -> None:
        self.log = tempfile.TemporaryFile()  # noqa: SIM115  # the process's stderr until close()
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        self.process = subprocess.Popen(
            [sys.executable, "-c", TRAINER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, text=True, preexec_fn=pinned(cpu),
        )  # fmt: skip
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        self._line()

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.log.seek(0)
            raise SystemExit(f"the trainer exited:\n{self.log.read().decode(errors='replace')[-5000:]}")
        return line

    def read(self, **request: Any) -> dict[str, Any]:
        self.send(**request)
        return self.receive()

    def send(self, **request: Any) -> None:
        """Starts a read (``receive()`` answers it): trainers sent to one after another read at once."""
        assert self.process.stdin is not None
        defaults = {"address": None, "worker_ports": [], "compression": "AUTO", "sharding": "OFF"}
        self.process.stdin.write(json.dumps({**defaults, **request}) + "\n")
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
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
    """In process against through one worker, per payload size, interleaved, each first in turn."""
    reads: dict[str, dict[str, list[dict[str, Any]]]] = {s: {"in process": [], "service": []} for s in SIZES}
    for run in range(args.runs):
        for label, size in SIZES.items():
            for where, address in in_turn((("in process", None), ("service", one.address)), run):
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
            "next() mean us": spread([r["mean_us"] for r in runs], 1),
            "next() max us": spread([r["max_us"] for r in runs], 1),
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
            for name, extra in in_turn(list(by_name.items()), run):
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
    """AUTO against None, 1 MB elements of each kind of data, through one worker, each first in turn."""
    choices = {"AUTO": "AUTO", "None": None}
    reads: dict[str, dict[str, list[dict[str, Any]]]] = {d: {c: [] for c in choices} for d in DATA}
    for run in range(args.runs):
        for data in DATA:
            for label, compression in in_turn(list(choices.items()), run):
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


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (a ``tfdata-server`` supervisor and its TensorFlow process)."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in task.read_text().split():
            found += descendants(int(child))
    return found


def worker_pids(one: Cluster) -> list[int]:
    return [pid for process, _, _ in one.processes[1:] for pid in descendants(process.pid)]


def read_together(trainers: list[Trainer], requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each trainer's read, all started at once (their windows overlap but for the send's few ms)."""
    for trainer, request in zip(trainers, requests, strict=True):
        trainer.send(**request)
    return [trainer.receive() for trainer in trainers]


def part_trainers(trainers: list[Trainer], one: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    """1 trainer alone, then N trainers at once on one service: each with its own job, and all in one
    job shared by ``job_name``; rounds interleaved, each compared with its own round's 1-trainer rate."""
    counts = [n for n in args.trainer_counts if n > 1]
    modes = ("own jobs", "one shared job")
    alone: list[float] = []
    reads: dict[str, dict[int, list[list[float]]]] = {m: {n: [] for n in counts} for m in modes}
    request = {"pipeline": "sleep", "sleep_ms": args.sleep_ms, "sharding": args.trainers_sharding,
               "address": one.address, "worker_ports": one.worker_ports, "warmup": args.scaleout_warmup,
               "seconds": args.scaleout_seconds}  # fmt: skip
    for run in range(args.runs):
        alone.append(rate(trainers[0].read(**request)))
        print(f"  trainers run {run + 1}/{args.runs}: 1 trainer alone: {alone[-1]:,.1f}/s", flush=True)
        for n in counts:
            for mode in in_turn(modes, run):
                job = None if mode == "own jobs" else f"trainers-{run}-{n}"
                rates = [rate(r) for r in read_together(trainers[:n], [{**request, "job_name": job}] * n)]
                reads[mode][n].append(rates)
                print(f"  trainers run {run + 1}/{args.runs}: {n} trainers, {mode}: "
                      f"{' + '.join(f'{r:,.1f}' for r in rates)} = {sum(rates):,.1f}/s", flush=True)  # fmt: skip
    results: dict[str, Any] = {
        "pipeline": f"range().apply(sleep {args.sleep_ms:g} ms)", "sharding": args.trainers_sharding,
        "workers": len(one.worker_ports), "1 trainer alone, elements/s": spread(alone, 1), "trainers": {},
    }  # fmt: skip
    for mode, by_n in reads.items():
        results["trainers"][mode] = {
            f"{n} trainers": {
                "total elements/s": spread([sum(r) for r in runs], 1),
                "each trainer, elements/s": spread([x for r in runs for x in r], 1),
                # Against the same round's rate of one trainer alone.
                "each trainer / alone": spread([x / a for r, a in zip(runs, alone, strict=True) for x in r], 3),
                "total / alone": spread([sum(r) / a for r, a in zip(runs, alone, strict=True)], 3),
            }
            for n, runs in by_n.items()
        }
    return results


def part_cache(trainers: list[Trainer], one: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    """A sweep of ``len(trainers)`` trials of one CPU-heavy pipeline: each its own job (every trial
    reads the whole stream, the workers compute it once per trial) against one job read through the
    workers' cross-trainer cache (``distribute(trial=k, job_name=...)``): the workers' CPU time."""
    pids = worker_pids(one)
    variants_ = ("without cache (own jobs)", "with cache (one job, trial=k)")
    rounds: dict[str, list[dict[str, Any]]] = {v: [] for v in variants_}
    request = {"pipeline": "burn", "burn": args.burn, "address": one.address, "worker_ports": one.worker_ports,
               "warmup": args.scaleout_warmup, "seconds": args.cache_seconds}  # fmt: skip
    for run in range(args.runs):
        for variant in in_turn(variants_, run):
            cached = variant == variants_[1]
            requests = [
                {
                    **request,
                    "job_name": f"sweep-{run}" if cached else None,
                    "trial": k if cached else None,
                    "cpu_pids": pids if k == 0 else [],
                }
                for k in range(len(trainers))
            ]
            reads = read_together(trainers, requests)
            rates = [rate(r) for r in reads]
            cores = reads[0]["cpu_seconds"] / reads[0]["seconds"]  # over trial 0's window
            rounds[variant].append({"rates": rates, "cores": cores})
            print(f"  cache run {run + 1}/{args.runs}: {variant}: trials {' / '.join(f'{r:,.1f}' for r in rates)}/s, "
                  f"workers {cores:.2f} CPU", flush=True)  # fmt: skip

    def figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "each trial, elements/s": spread([x for r in runs for x in r["rates"]], 1),
            "workers' CPU (cores)": spread([r["cores"] for r in runs], 3),
            # CPU time of the workers per element a trial read (every trial reads the whole stream).
            "workers' CPU ms per element read": spread([1000 * r["cores"] / sum(r["rates"]) for r in runs], 3),
        }

    pairs = list(zip(rounds[variants_[1]], rounds[variants_[0]], strict=True))  # (with, without) of one round
    results: dict[str, Any] = {
        "pipeline": f"counter().map({args.burn} 128x128 matmuls)", "trials": len(trainers),
        "workers": len(one.worker_ports), "worker processes measured": len(pids),
        "cross_trainer_cache_size_bytes": args.cache_mib * 2**20,
        **{v: figures(rounds[v]) for v in variants_},
        "with / without, each trial's elements/s": spread(
            [statistics.median(w["rates"]) / statistics.median(o["rates"]) for w, o in pairs], 3
        ),
        "with / without, CPU ms per element read": spread(
            [(w["cores"] / sum(w["rates"])) / (o["cores"] / sum(o["rates"])) for w, o in pairs], 3
        ),
    }  # fmt: skip
    return results


def print_cost(results: dict[str, Any], pinning: str) -> None:
    rows = []
    for label in SIZES:
        for where in ("in process", "service"):
            figures = results[label][where]
            rows.append([label, where, show(figures["elements/s"]), show(figures["next() median us"], 1),
                         show(figures["next() p90 us"], 1), show(figures["next() mean us"], 1),
                         show(figures["next() max us"])])  # fmt: skip
        rows.append(
            [label, "service / in process", show(results[label]["service / in process, elements/s"], 3), "", "", "",
             ""]
        )  # fmt: skip
    print_table(f"Cost of the service: random payloads, 1 worker, compression AUTO ({pinning}); median (min-max) "
                "over the runs; a next() mean far above its median: the rate is set by a few slow elements",
                ["element", "read", "elements/s", "next() median µs", "next() p90 µs", "next() mean µs",
                 "next() max µs"], rows)  # fmt: skip


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


def print_trainers(results: dict[str, Any], pinning: str) -> None:
    alone = results["1 trainer alone, elements/s"]
    rows = [["1", "alone", show(alone, 1), show(alone, 1), "1.000", "1.000"]]
    for mode, by_n in results["trainers"].items():
        for n, point in by_n.items():
            rows.append([n.split()[0], mode, show(point["total elements/s"], 1),
                         show(point["each trainer, elements/s"], 1), show(point["each trainer / alone"], 3),
                         show(point["total / alone"], 3)])  # fmt: skip
    print_table(
        f"Many trainers, one service ({pinning}): {results['pipeline']}, {results['workers']} workers, sharding "
        f"{results['sharding']}; ratios against the same round's 1 trainer alone; median (min-max)",
        ["trainers", "jobs", "total elements/s", "each trainer", "each / alone", "total / alone"], rows,
    )  # fmt: skip


def print_cache(results: dict[str, Any], pinning: str) -> None:
    rows = []
    for variant in ("without cache (own jobs)", "with cache (one job, trial=k)"):
        figures = results[variant]
        rows.append([variant, show(figures["each trial, elements/s"], 1), show(figures["workers' CPU (cores)"], 3),
                     show(figures["workers' CPU ms per element read"], 3)])  # fmt: skip
    rows.append(["with / without", show(results["with / without, each trial's elements/s"], 3), "",
                 show(results["with / without, CPU ms per element read"], 3)])  # fmt: skip
    print_table(
        f"A sweep of {results['trials']} trials ({pinning}): {results['pipeline']}, {results['workers']} workers, "
        f"cross_trainer_cache_size_bytes {results['cross_trainer_cache_size_bytes']:,}; workers' CPU from "
        "/proc/<pid>/stat over trial 0's window; median (min-max)",
        ["sweep", "each trial elements/s", "workers' CPU (cores)", "workers' CPU ms per element read"], rows,
    )  # fmt: skip


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
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {','.join(PARTS)}")
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
    parser.add_argument("--trainers", default="1,2,4", help="the many-trainer part's trainer counts")
    parser.add_argument("--trainers-sharding", default="OFF", help="its sharding policy (OFF or DYNAMIC)")
    parser.add_argument("--trainer-workers", type=int, default=2, help="the workers of the trainers and cache parts")
    parser.add_argument("--trials", type=int, default=3, help="the cache part's trials of one sweep")
    parser.add_argument("--burn", type=int, default=64, help="the cache part's 128x128 matmuls per element")
    parser.add_argument("--cache-seconds", type=float, default=6.0, help="the window of each cache point")
    parser.add_argument("--cache-mib", type=int, default=64, help="the workers' cross_trainer_cache_size_bytes, MiB")
    parser.add_argument("--no-pin", action="store_true", help="leave the processes on every CPU")
    parser.add_argument("--png", type=Path, help=f"where to draw the scale-out curve (default {PNG.relative_to(ROOT)})")
    parser.add_argument("--quick", action="store_true", help="one short run of each point, for development")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.warmup, args.seconds, args.scaleout_warmup, args.scaleout_seconds = 1, 0.5, 1.0, 1.5, 2.0
        args.cache_seconds = 4.0  # shorter windows mostly measure the buffers filled before them
        args.png = args.png or OUT / "dataplane-scaleout-quick.png"  # the committed curve is of full runs
    parts = args.parts.split(",")
    if unknown := set(parts) - set(PARTS):
        parser.error(f"--parts: unknown {', '.join(sorted(unknown))}; the parts are {','.join(PARTS)}")
    args.trainer_counts = sorted({1, *map(int, args.trainers.split(","))})
    counts = sorted({1, *map(int, args.workers.split(","))})
    pin = not args.no_pin and len(os.sched_getaffinity(0)) >= 2
    client_cpu, server_cpu = (CLIENT_CPU, SERVER_CPU) if pin else (None, None)
    pinning = (f"trainer pinned to CPU {CLIENT_CPU}, dispatchers and workers to CPU {SERVER_CPU}" if pin
               else "nothing pinned")  # fmt: skip
    many_pinning = (f"every trainer pinned to CPU {CLIENT_CPU}, the dispatcher and workers to CPU {SERVER_CPU}"
                    if pin else "nothing pinned")  # fmt: skip
    print(f"{pinning}; {os.cpu_count()} CPUs; runs of each point: {args.runs}", flush=True)
    results: dict[str, Any] = {
        "when": now_rfc3339(), "cpus": os.cpu_count(), "pinning": pinning, "runs": args.runs,
        "order": "interleaved, each run starting with the next variant (A B, B A, ...)",
    }  # fmt: skip
    started = time.monotonic()
    with ExitStack() as stack:
        wanted = counts if "scaleout" in parts else [1] if {"cost", "compression"} & set(parts) else []
        clusters = {n: stack.enter_context(cluster(n, server_cpu, "DYNAMIC")) for n in wanted}
        many = {"trainers", "cache"} & set(parts)
        shared = None
        if many:  # one service for the many-trainer parts, its workers with a cross-trainer cache
            options = {"cross_trainer_cache_size_bytes": args.cache_mib * 2**20}
            shared = stack.enter_context(cluster(args.trainer_workers, server_cpu, "DYNAMIC", worker_options=options))
        needed = max([1, *(args.trainer_counts if "trainers" in parts else []), args.trials if "cache" in parts else 1])
        trainers = [Trainer(client_cpu, wait=False) for _ in range(needed)]
        for one_trainer in trainers:
            stack.callback(one_trainer.close)
        for one_trainer in trainers:
            one_trainer.wait_ready()
        trainer = trainers[0]
        for one in [*clusters.values(), *([shared] if shared else [])]:
            one.wait_ready(300)
        workers = sum(wanted) + (args.trainer_workers if shared else 0)
        print(f"{workers} workers, {len(wanted) + bool(shared)} dispatchers and {needed} trainers ready after "
              f"{time.monotonic() - started:.0f}s", flush=True)  # fmt: skip
        if "cost" in parts:
            results["cost"] = part_cost(trainer, clusters[1], args)
        if "scaleout" in parts:
            results["scale-out"] = part_scaleout(trainer, clusters, args)
        if "compression" in parts:
            results["compression"] = part_compression(trainer, clusters[1], args)
        if "trainers" in parts and shared:
            results["trainers"] = part_trainers(trainers, shared, args)
            results["trainers"]["pinning"] = many_pinning
        if "cache" in parts and shared:
            results["cache"] = part_cache(trainers[: args.trials], shared, args)
            results["cache"]["pinning"] = many_pinning
    results["seconds"] = round(time.monotonic() - started)
    if "cost" in results:
        print_cost(results["cost"], pinning)
    if "scale-out" in results:
        print_scaleout(results["scale-out"])
        draw(results["scale-out"], args.png or PNG)
    if "compression" in results:
        print_compression(results["compression"])
    if "trainers" in results:
        print_trainers(results["trainers"], many_pinning)
    if "cache" in results:
        print_cache(results["cache"], many_pinning)
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
