"""``/metrics`` of a dispatcher or worker pod, in Prometheus' text format.

The metrics are listed in docs/operations.md, "The pods' endpoints and metrics".

The supervisor serves them. What only TensorFlow can count (a worker's tasks, a dispatcher's
registered workers) arrives from the TensorFlow process with its status line every second
(``probestate.status_line``); the CPU both processes use is read from /proc here, so a scrape
never waits on TensorFlow. Names start with ``tfdata_<kind>_``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tfdata_operator.server.probestate import ProbeState, Reply
from tfdata_operator.wire import serverconfig

# CPU utilization is the rate over this window: long enough to smooth a 1 s sampling, short
# enough for an autoscaler that decides every few seconds.
CPU_WINDOW_SECONDS = 10.0
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# What the worker's tasks and CPU are called in its /metrics: the dispatcher reads them there.
WORKER_TASKS = "tfdata_worker_tasks"
WORKER_CPU_UTILIZATION = "tfdata_worker_cpu_utilization"


def cpu_given(config: serverconfig.ServerConfig, cgroup: Path = Path("/sys/fs/cgroup")) -> tuple[float, str]:
    """(cores, where that came from): the configuration, else the cgroup's quota, else the CPUs we may use."""
    if config.cpu_given_millicores is not None:
        return config.cpu_given_millicores / 1000, "config"
    try:  # cgroup v2: "<quota> <period>" or "max <period>"
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period), "cgroup"
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota_us = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
        if quota_us > 0:
            return quota_us / period_us, "cgroup"
    except (OSError, ValueError):
        pass
    try:
        return float(len(os.sched_getaffinity(0))), "host"
    except AttributeError:
        return float(os.cpu_count() or 1), "host"


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime: fields 14 and 15 of stat


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


class CpuMeter:
    """CPU time of the pod's processes (supervisor + TensorFlow), and its recent rate over CPU given."""

    def __init__(
        self,
        given: tuple[float, str],
        clock: Callable[[], float] = time.monotonic,
        read_child: Callable[[int], float] = process_cpu_seconds,
        read_own: Callable[[], float] = own_cpu_seconds,
    ) -> None:
        self.given_cores, self.given_source = given
        self._clock, self._read_child, self._read_own = clock, read_child, read_own
        self._lock = threading.Lock()
        self._child: int | None = None
        self._child_seconds = 0.0  # of children that have ended, so the counter never goes back
        self._last_child = 0.0
        self._samples: collections.deque[tuple[float, float]] = collections.deque()

    def attach(self, pid: int) -> None:
        with self._lock:
            self._child_seconds += self._last_child
            self._child, self._last_child = pid, 0.0

    def total(self) -> float:
        with self._lock:
            return self._total_locked()

    def _total_locked(self) -> float:
        if self._child is not None:
            # Once it has ended, its last reading stands.
            with contextlib.suppress(OSError, ValueError, IndexError):
                self._last_child = self._read_child(self._child)
        return self._read_own() + self._child_seconds + self._last_child

    def sample(self) -> None:
        """Called about every second (with each status line)."""
        with self._lock:
            now = self._clock()
            self._samples.append((now, self._total_locked()))
            while len(self._samples) > 2 and now - self._samples[1][0] >= CPU_WINDOW_SECONDS:
                self._samples.popleft()

    def utilization(self) -> float | None:
        """CPU used over CPU given, over the last ``CPU_WINDOW_SECONDS``; None before two samples."""
        with self._lock:
            if len(self._samples) < 2:
                return None
            (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
        if t1 <= t0 or self.given_cores <= 0:
            return None
        return max(0.0, (c1 - c0) / (t1 - t0) / self.given_cores)


def gauge(name: str, documentation: str, value: float | None, labels: dict[str, str] | None = None) -> Iterable[Metric]:
    """One gauge, or nothing when its value is unknown (an absent series, not a made-up 0)."""
    if value is None:
        return
    metric = GaugeMetricFamily(name, documentation, labels=list(labels or {}))
    metric.add_metric(list((labels or {}).values()), value)
    yield metric


class ServerCollector(Collector):
    """The metrics every pod serves, plus the kind's own (``extra``), read at scrape time."""

    def __init__(
        self, kind: str, state: ProbeState, cpu: CpuMeter, extra: Callable[[], Iterable[Metric]] | None = None
    ) -> None:
        self.kind, self.state, self.cpu, self.extra = kind, state, cpu, extra

    def collect(self) -> Iterable[Metric]:
        prefix = f"tfdata_{self.kind}"
        ready, _ = self.state.readiness()
        yield from gauge(f"{prefix}_ready", f"1 while the {self.kind} answers its readiness probe", float(ready))
        cpu = CounterMetricFamily(
            f"{prefix}_cpu_seconds",
            "CPU time used by the pod's tfdata-server processes (supervisor and TensorFlow), user + system",
        )
        cpu.add_metric([], self.cpu.total())
        yield cpu
        yield from gauge(
            f"{prefix}_cpu_given_cores",
            "The CPU the pod is given: the configured cpu_given_millicores (its limit, else its request), "
            "else the cgroup quota, else the CPUs the process may run on",
            self.cpu.given_cores,
            {"source": self.cpu.given_source},
        )
        yield from gauge(
            f"{prefix}_cpu_utilization",
            f"CPU used over CPU given, over the last {CPU_WINDOW_SECONDS:.0f}s (1 = saturated; above 1 when bursting "
            "above a request)",
            self.cpu.utilization(),
        )
        stats = self.state.stats()
        if self.kind == "worker":
            yield from gauge(
                WORKER_TASKS,
                "Tasks the worker holds: one per job a client is attached to, kept until the job ends or is "
                "garbage-collected",
                stats.get("tasks"),
            )
        else:
            yield from gauge(
                "tfdata_dispatcher_workers_registered",
                "Workers registered with the dispatcher",
                stats.get("workers_registered"),
            )
        if self.extra is not None:
            yield from self.extra()


def metrics_route(collector: Collector) -> Callable[[], Reply]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)

    def answer() -> Reply:
        return Reply(200, generate_latest(registry), "text/plain; version=0.0.4; charset=utf-8")

    return answer
