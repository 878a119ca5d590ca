"""The dispatcher pod's view of its service: client reports, its workers' numbers, and the signals.

Runs in the dispatcher's supervisor (no TensorFlow). Every ``worker_poll_interval_ms`` it asks
the dispatcher for its registered workers (TensorFlow's ``GetWorkers`` call over gRPC, so DYNAMIC
services are covered too; static services add their listed workers) and reads each worker's
/metrics on ``worker_health_port``. Trainers POST ``signals.ClientReport`` here. One GET of
``signals.SIGNALS_PATH`` then answers "is any client reading?" with the autoscaler's inputs.

Why worker tasks answer "is any client reading?": TensorFlow creates a task on every
registered worker for every job a client reads, and deletes it (at the worker's next
heartbeat) only once the job has ended or, after its last client released it or stopped
heartbeating, was garbage-collected. A client that steps slowly still heartbeats every second
from TensorFlow's own thread, so its tasks stay. ``serverconfig.DEFAULTS`` makes the deletion
prompt; docs/operations.md ("The pods' endpoints and metrics") has the resulting bounds.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import re
import socket
import statistics
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from tfdata_operator.server import LOGGER_NAME
from tfdata_operator.server.journal import JOURNAL_DIR, JournalTail, LocalFileSystem, join
from tfdata_operator.server.metrics import WORKER_CPU_UTILIZATION, WORKER_TASKS, gauge
from tfdata_operator.server.probestate import Reply
from tfdata_operator.wire import serverconfig, signals
from tfdata_operator.wire.serverconfig import DispatcherServerConfig

WORKER_TIMEOUT_SECONDS = 2.0
IDLE_REASON = "no client is attached, no worker holds a task, no reporting client reads"
GET_WORKERS = "/tensorflow.data.DispatcherService/GetWorkers"


# The name TensorFlow's dispatcher gives a job read without a job_name (GetOrCreateJob in
# dispatcher_impl.cc: "anonymous_job_", the job id, "_", a random number).
ANONYMOUS_JOB = re.compile(r"anonymous_job_[0-9]+_[0-9]+")


class JournalClients:
    """The clients attached to jobs, read from a fault-tolerant dispatcher's journal (``journal``).

    TensorFlow journals ``AcquireIterationClient`` when a client starts reading a job and
    ``ReleaseIterationClient`` when it lets go (its iterator is deleted) or when the
    dispatcher gives up on it (``client_timeout_ms`` without a heartbeat), before it answers.
    This covers what worker tasks miss: a client still draining its buffer after the last
    task ended, and one that has just started. ``CreateJob`` and ``CreateIteration`` say which
    job a client reads, so that every trainer is counted by job, a plain ``distribute()`` one
    that reports nothing too. Each call reads only what was appended since the last.

    Bounded: at most ``MAX_TRACKED`` jobs and iterations are remembered (TensorFlow journals no
    job's end; an iteration's garbage collection drops it). Past that, those no client reads are
    forgotten, and a client of a forgotten job is counted under no name.
    """

    MAX_TRACKED = 10_000

    def __init__(self, work_dir: str) -> None:
        self._tail = JournalTail(LocalFileSystem(), join(work_dir, JOURNAL_DIR))
        self._jobs: dict[int, str | None] = {}  # job id -> its name (None: a job without one)
        self._iterations: dict[int, int] = {}  # iteration id -> job id
        self._attached: dict[int, int] = {}  # client id -> iteration id
        self._lock = threading.Lock()

    def attached(self) -> int:
        return sum(self.by_job().values())

    def by_job(self) -> dict[str | None, int]:
        """The attached clients, counted by the name of the job they read (None: jobs without one)."""
        with self._lock:
            updates = self._tail.read()
            if self._tail.rewound:  # every update again, from the first
                self._jobs.clear()
                self._iterations.clear()
                self._attached.clear()
            for update in updates:
                self._apply(update)
            if len(self._jobs) > self.MAX_TRACKED or len(self._iterations) > self.MAX_TRACKED:
                self._forget_unread()
            counts: dict[str | None, int] = {}
            for iteration in self._attached.values():
                name = self._jobs.get(self._iterations.get(iteration, -1))
                counts[name] = counts.get(name, 0) + 1
            return counts

    def _apply(self, update: Any) -> None:
        if update.HasField("create_job"):
            # As a report gives it: text, at most MAX_JOB_NAME characters; None for a job without a name.
            name = update.create_job.name.decode("utf-8", errors="replace")
            self._jobs[update.create_job.job] = None if ANONYMOUS_JOB.fullmatch(name) else name[: signals.MAX_JOB_NAME]
        elif update.HasField("create_iteration"):
            self._iterations[update.create_iteration.iteration] = update.create_iteration.job
        elif update.HasField("acquire"):
            self._attached[update.acquire.client] = update.acquire.iteration
        elif update.HasField("release"):
            self._attached.pop(update.release.client, None)
        elif update.HasField("garbage_collect"):
            self._iterations.pop(update.garbage_collect.iteration, None)

    def _forget_unread(self) -> None:
        read = set(self._attached.values())
        self._iterations = {i: job for i, job in self._iterations.items() if i in read}
        jobs = set(self._iterations.values())
        self._jobs = {job: name for job, name in self._jobs.items() if job in jobs}


class ClientTable:
    """The reporting clients, bounded, forgotten on ``done`` or when their reports stop."""

    def __init__(self, timeout_seconds: float, max_clients: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout, self._max, self._clock = timeout_seconds, max_clients, clock
        self._lock = threading.Lock()
        self._clients: dict[str, tuple[signals.ClientReport, float]] = {}
        self.accepted = 0
        self.rejected = 0

    def receive(self, body: bytes) -> Reply:
        try:
            report = signals.ClientReport.from_json(body)
        except (signals.ReportError, TypeError) as exc:
            with self._lock:
                self.rejected += 1
            return Reply.text(400, f"bad client report: {exc}")
        with self._lock:
            self._expire()
            if report.done:
                self._clients.pop(report.client_id, None)
            elif report.client_id not in self._clients and len(self._clients) >= self._max:
                self.rejected += 1
                return Reply.text(
                    429, f"this dispatcher already tracks {self._max} clients (max_tracked_clients); try again later"
                )
            else:
                self._clients[report.client_id] = (report, self._clock())
            self.accepted += 1
        return Reply(204, b"")

    def live(self) -> list[signals.ClientReport]:
        with self._lock:
            self._expire()
            return [report for report, _ in self._clients.values()]

    def _expire(self) -> None:
        now = self._clock()
        for client_id in [c for c, (_, at) in self._clients.items() if now - at > self._timeout]:
            del self._clients[client_id]


@dataclass(frozen=True)
class WorkerReading:
    address: str
    tasks: float | None = None
    cpu_utilization: float | None = None
    # Set when the worker did not answer; ``gone`` when its name no longer resolves (no pod).
    error: str | None = None
    gone: bool = False


@dataclass(frozen=True)
class Poll:
    at: float
    registered: tuple[str, ...] | None  # None: GetWorkers failed (see ``error``)
    workers: tuple[WorkerReading, ...]
    error: str | None = None


def read_worker(address: str, health_port: int) -> WorkerReading:
    host = address.rsplit(":", 1)[0]
    url = f"http://{host}:{health_port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=WORKER_TIMEOUT_SECONDS) as response:
            text = response.read().decode()
    except urllib.error.URLError as exc:
        gone = isinstance(exc.reason, socket.gaierror)
        return WorkerReading(address, error=f"{url}: {exc.reason}", gone=gone)
    except OSError as exc:
        return WorkerReading(address, error=f"{url}: {exc}")
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[sample.name] = sample.value
    except ValueError as exc:
        return WorkerReading(address, error=f"{url}: unreadable metrics: {exc}")
    if WORKER_TASKS not in values:
        # A worker whose TensorFlow process is not running (yet) cannot say what it serves.
        return WorkerReading(address, error=f"{url}: no {WORKER_TASKS} (its TensorFlow server is not running)")
    return WorkerReading(address, values[WORKER_TASKS], values.get(WORKER_CPU_UTILIZATION))


def get_workers(dispatcher: str, timeout: float = WORKER_TIMEOUT_SECONDS) -> tuple[str, ...]:
    """The addresses of the workers registered with a dispatcher (TensorFlow's GetWorkers call).

    GetWorkersRequest is empty; GetWorkersResponse is ``repeated WorkerInfo workers = 1`` with
    ``string address = 1`` (tensorflow/core/data/service/dispatcher.proto). The wheel does not
    ship those classes, so they are declared here; other WorkerInfo fields are skipped.
    """
    import grpc  # type: ignore[import-untyped]

    with grpc.insecure_channel(dispatcher) as channel:
        call = channel.unary_unary(GET_WORKERS, request_serializer=lambda _: b"", response_deserializer=_parse_workers)
        workers: tuple[str, ...] = call(None, timeout=timeout)
    return workers


def _parse_workers(data: bytes) -> tuple[str, ...]:
    message = _messages()["GetWorkersResponse"]()
    message.ParseFromString(data)
    return tuple(str(worker.address) for worker in message.workers)


@functools.cache
def _messages() -> dict[str, Any]:
    """The few TensorFlow messages read here, declared with only the fields read (see callers)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="tfdata_tf_messages.proto", package="tfdata_tf")

    def message(name: str, *fields: tuple[str, int, int, str]) -> None:
        declared = file.message_type.add(name=name)
        for field_name, number, kind, type_name in fields:
            repeated = field.LABEL_REPEATED if field_name == "workers" else field.LABEL_OPTIONAL
            declared.field.add(name=field_name, number=number, type=kind, label=repeated)
            if type_name:
                declared.field[-1].type_name = type_name

    message("WorkerInfo", ("address", 1, field.TYPE_STRING, ""))
    message("GetWorkersResponse", ("workers", 1, field.TYPE_MESSAGE, ".tfdata_tf.WorkerInfo"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    names = ("GetWorkersResponse",)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tfdata_tf.{name}")) for name in names}


def _describe(exc: Exception) -> str:
    """grpc's errors say what happened in ``details()``; their str() is a multi-line dump."""
    details = getattr(exc, "details", None)
    return str(details()) if callable(details) else str(exc)


class Aggregator:
    """Polls the workers, keeps the client reports, and answers with ``signals.ServiceSignals``."""

    def __init__(
        self,
        config: DispatcherServerConfig,
        workers_registered: Callable[[], float | None],
        clock: Callable[[], float] = time.monotonic,
        list_workers: Callable[[str], tuple[str, ...]] = get_workers,
        read: Callable[[str, int], WorkerReading] = read_worker,
    ) -> None:
        self.config = config
        self._workers_registered = workers_registered
        self._clock, self._list_workers, self._read = clock, list_workers, read
        self.clients = ClientTable(
            serverconfig.setting(config, "client_report_timeout_ms") / 1000,
            serverconfig.setting(config, "max_tracked_clients"),
            clock,
        )
        self._interval = serverconfig.setting(config, "worker_poll_interval_ms") / 1000
        self.journal = JournalClients(config.work_dir) if config.fault_tolerant_mode and config.work_dir else None
        self._lock = threading.Lock()
        self._poll: Poll | None = None
        self._idle_since: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workers", daemon=True)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="worker-metrics")
        self.log = logging.getLogger(LOGGER_NAME)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # never let the signal thread die: the signal would freeze
                self.log.warning("could not read the workers: %s", exc)
            self._stop.wait(self._interval)

    def poll_once(self) -> Poll:
        registered: tuple[str, ...] | None = None
        error = None
        try:
            registered = self._list_workers(f"localhost:{self.config.port}")
        except Exception as exc:  # grpc.RpcError, e.g. "Dispatcher has not started yet"
            error = f"could not list the registered workers: {_describe(exc)}"
        addresses = sorted(set(registered or ()) | set(self.config.worker_addresses or ()))
        readings: tuple[WorkerReading, ...] = ()
        if self.config.worker_health_port is not None and addresses:
            port = self.config.worker_health_port
            readings = tuple(self._pool.map(lambda a: self._read(a, port), addresses))
        poll = Poll(self._clock(), registered, readings, error)
        with self._lock:
            self._poll = poll
        self.signals()  # keeps idle_since moving even when nobody asks
        return poll

    def signals(self) -> signals.ServiceSignals:
        now = self._clock()
        with self._lock:
            poll = self._poll
        clients = self.clients.live()
        why: list[str] = []  # why "reading" is True; empty means idle
        answering, unreachable, registered = self._workers_why(poll, why)
        attached = self._journal_why(why)
        if clients:
            why.append(f"{len(clients)} reporting clients have not said done")
        with self._lock:
            if why:
                self._idle_since = None
            elif self._idle_since is None:
                self._idle_since = now
            idle = 0.0 if self._idle_since is None else now - self._idle_since
        utilizations = [w.cpu_utilization for w in answering if w.cpu_utilization is not None]
        stalls = [c.stall_fraction for c in clients]
        timed = [c for c in clients if c.window_seconds > 0]
        jobs, jobs_not_listed = signals.job_readings(clients, attached)
        return signals.ServiceSignals(
            reading=bool(why),
            reasons=tuple(why) if why else (IDLE_REASON,),
            idle_seconds=round(idle, 3),
            registered_workers=None if registered is None else int(registered),
            workers_answering=len(answering),
            workers_unreachable=tuple(unreachable),
            worker_tasks=int(sum(w.tasks or 0 for w in answering)),
            worker_cpu_utilization_mean=statistics.fmean(utilizations) if utilizations else None,
            worker_cpu_utilization_max=max(utilizations) if utilizations else None,
            reporting_clients=len(clients),
            client_stall_fraction_mean=statistics.fmean(stalls) if stalls else None,
            client_stall_fraction_max=max(stalls) if stalls else None,
            age_seconds=round(now - poll.at, 3) if poll is not None else 0.0,
            client_elements_per_second=sum(c.elements / c.window_seconds for c in timed) if timed else None,
            jobs=jobs,
            jobs_not_listed=jobs_not_listed,
        )

    def _workers_why(self, poll: Poll | None, why: list[str]) -> tuple[list[WorkerReading], list[str], float | None]:
        """Why the workers say "reading" (added to ``why``); the workers that answered, the addresses of
        those that did not, and how many are registered (None: unknown)."""
        answering: list[WorkerReading] = []
        unreachable: list[str] = []
        registered = self._workers_registered()
        if poll is None:
            why.append("the dispatcher has not read its workers yet")
        elif self.config.worker_health_port is None:
            why.append("the workers are not asked (no worker_health_port in the configuration): unknown")
        else:
            if poll.error is not None:
                why.append(f"{poll.error}: unknown")
            if registered is None and poll.registered is not None:
                registered = float(len(poll.registered))
            answering = [w for w in poll.workers if w.error is None]
            unreachable = [w.address for w in poll.workers if w.error is not None]
            busy = [w for w in answering if (w.tasks or 0) > 0]
            if busy:
                tasks = sum(w.tasks or 0 for w in busy)
                why.append(f"{len(busy)} of {len(answering)} answering workers hold tasks ({tasks:.0f} in all)")
            # A worker that exists but does not answer might be the one serving a reader; one
            # whose name no longer resolves has no pod and serves nobody (DYNAMIC keeps removed
            # workers registered forever).
            silent = [w for w in poll.workers if w.error is not None and not w.gone]
            if silent:
                why.append(f"{len(silent)} workers did not answer, so they may be serving: {silent[0].error}")
            elif registered is not None and registered > len(poll.workers):
                # Registered since the last poll: it may already serve a new reader.
                why.append(f"{registered:.0f} workers registered, {len(poll.workers)} asked so far: unknown")
        return answering, unreachable, registered

    def _journal_why(self, why: list[str]) -> dict[str | None, int] | None:
        """Clients attached to jobs, by the dispatcher's journal (added to ``why``); returns them by
        job name, or None when there is no journal or it could not be read."""
        if self.journal is None:
            return None
        try:
            by_job = self.journal.by_job()
        except OSError as exc:
            why.append(f"could not read the dispatcher's journal: {exc}: unknown")
            return None
        if attached := sum(by_job.values()):
            why.append(f"{attached} clients attached to jobs (the dispatcher's journal)")
        return by_job

    def signals_route(self) -> Reply:
        return Reply(200, self.signals().to_json().encode(), "application/json")

    def metrics(self) -> Iterable[Metric]:
        """The dispatcher's own series beyond ``metrics.ServerCollector``'s."""
        s = self.signals()
        yield from gauge(
            "tfdata_dispatcher_reading", "1 while any client may be reading (see /v1/signals)", float(s.reading)
        )
        yield from gauge(
            "tfdata_dispatcher_idle_seconds", "Seconds since the last client stopped reading", s.idle_seconds
        )
        yield from gauge(
            "tfdata_dispatcher_workers_listed", "Workers in the static list", _count(self.config.worker_addresses)
        )
        yield from gauge(
            "tfdata_dispatcher_workers_answering", "Workers whose /metrics the dispatcher read", s.workers_answering
        )
        yield from gauge(
            "tfdata_dispatcher_workers_unreachable", "Workers whose /metrics the dispatcher could not read",
            len(s.workers_unreachable),
        )  # fmt: skip
        yield from gauge("tfdata_dispatcher_worker_tasks", "Tasks over the workers that answered", s.worker_tasks)
        yield from gauge(
            "tfdata_dispatcher_worker_cpu_utilization_mean", "Mean of the workers' CPU used over CPU given",
            s.worker_cpu_utilization_mean,
        )  # fmt: skip
        yield from gauge(
            "tfdata_dispatcher_worker_cpu_utilization_max", "Highest worker CPU used over CPU given",
            s.worker_cpu_utilization_max,
        )  # fmt: skip
        yield from gauge(
            "tfdata_dispatcher_reporting_clients", "Clients whose reports say they read", s.reporting_clients
        )
        yield from gauge(
            "tfdata_dispatcher_client_stall_fraction_mean",
            "Mean over reporting clients of the time their training loop waited for data over wall time",
            s.client_stall_fraction_mean,
        )
        yield from gauge(
            "tfdata_dispatcher_client_stall_fraction_max", "Highest data-stall fraction of a reporting client",
            s.client_stall_fraction_max,
        )  # fmt: skip
        yield from gauge(
            "tfdata_dispatcher_client_elements_per_second", "Elements per second the reporting clients read in all",
            s.client_elements_per_second,
        )  # fmt: skip
        reports = CounterMetricFamily("tfdata_dispatcher_client_reports", "Client reports received", labels=["result"])
        reports.add_metric(["accepted"], self.clients.accepted)
        reports.add_metric(["rejected"], self.clients.rejected)
        yield reports


def _count(values: tuple[str, ...] | None) -> float | None:
    return None if values is None else float(len(values))
