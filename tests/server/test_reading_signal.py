""" "Is any client reading?" and /metrics, with real ``tfdata-server`` processes and real tf.data clients.

One fault-tolerant dispatcher (as the operator runs it by default) and one worker on 127.0.0.1,
with the server program's default timings, so the bounds measured here are the documented
ones (docs/concepts.md, "Is any client reading?"). The tests run in order on the same service; each starts from idle.
Figures are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tfdata_operator.wire import serverconfig, signals
from tfdata_operator.wire.serverconfig import DispatcherServerConfig, WorkerServerConfig

from fixtures.support import free_port, wait_for

SERVER_BIN = Path(sys.executable).parent / "tfdata-server"
START_TIMEOUT = 90.0
# The documented bound for "idle again" after the last reader finished or vanished.
IDLE_BOUND_SECONDS = 30.0
REPORT_TIMEOUT_MS = 4000

CLIENT = textwrap.dedent(
    """
    import sys, time
    import tensorflow as tf
    service, delay, count = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    dataset = tf.data.Dataset.range(count).apply(
        tf.data.experimental.service.distribute(processing_mode="distributed_epoch", service=service))
    for element in dataset:
        print("element", int(element), time.monotonic(), flush=True)
        time.sleep(delay)  # a slow training step
    print("done", time.monotonic(), flush=True)
    """
)


# A trainer that reads one shared job through the client helper's iterate(), which reports its
# data stalls to the dispatcher every second.
REPORTING_CLIENT = textwrap.dedent(
    """
    import sys, time
    import tensorflow as tf
    from tfdata_operator import client
    service, report_url, job = sys.argv[1], sys.argv[2], sys.argv[3]
    dataset = tf.data.Dataset.range(10_000_000).apply(tf.data.experimental.service.distribute(
        processing_mode="distributed_epoch", service=service, job_name=job))
    for element in client.iterate(dataset, report_url=report_url, job_name=job, interval=1.0):
        print("element", int(element), time.monotonic(), flush=True)
        time.sleep(0.2)  # a training step
    """
)


@dataclass
class Service:
    dispatcher: subprocess.Popen[bytes]
    worker: subprocess.Popen[bytes]
    config: DispatcherServerConfig
    worker_config: WorkerServerConfig
    logs: list[Path]

    def url(self, path: str, worker: bool = False) -> str:
        port = self.worker_config.health_port if worker else self.config.health_port
        return f"http://127.0.0.1:{port}{path}"

    def signals(self) -> signals.ServiceSignals:
        with urllib.request.urlopen(self.url(signals.SIGNALS_PATH), timeout=5) as response:
            return signals.ServiceSignals.from_json(response.read())

    def metrics(self, worker: bool = False) -> dict[str, float]:
        with urllib.request.urlopen(self.url("/metrics", worker), timeout=5) as response:
            text = response.read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def post(self, body: bytes | str) -> tuple[int, str]:
        data = body.encode() if isinstance(body, str) else body
        request = urllib.request.Request(self.url(signals.REPORT_PATH), data=data, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def report(self, client_id: str, stall: float = 0.3, done: bool = False) -> None:
        report = signals.ClientReport(client_id, stall, signals.REPORT_EVERY_SECONDS, 10, done=done)
        status, body = self.post(report.to_json())
        assert status == 204, body

    def show(self) -> str:
        try:
            seen = self.signals()
        except Exception as exc:
            seen = exc  # type: ignore[assignment]
        logs = "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}" for p in self.logs)
        return f"{seen}\n{logs}"

    def wait_idle(self, timeout: float, since: float) -> float:
        """Waits until the service reads idle; returns the seconds since ``since``."""
        wait_for(lambda: not self.signals().reading, timeout, "the service to read idle", 0.25, self.show)
        return time.monotonic() - since


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    if not SERVER_BIN.exists():
        pytest.fail(f"{SERVER_BIN} is missing: install the operator package (make venv)")
    tmp = tmp_path_factory.mktemp("signals")
    port, worker_port = free_port(), free_port()
    worker = WorkerServerConfig(
        port=worker_port,
        health_port=free_port(),
        dispatcher_address=f"127.0.0.1:{port}",
        worker_address_format=f"{serverconfig.POD_NAME_PLACEHOLDER}:{worker_port}",
    )
    dispatcher = DispatcherServerConfig(
        port=port,
        health_port=free_port(),
        work_dir=str(tmp / "journal"),
        fault_tolerant_mode=True,
        worker_health_port=worker.health_port,
        client_report_timeout_ms=REPORT_TIMEOUT_MS,
        max_tracked_clients=3,
    )
    environ = {"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "1", serverconfig.POD_NAME_ENV: "127.0.0.1"}
    # The server program imports this package as the test process does (a worktree's PYTHONPATH).
    if os.environ.get("PYTHONPATH"):
        environ["PYTHONPATH"] = os.environ["PYTHONPATH"]
    processes, logs = [], []
    for kind, config in (("dispatcher", dispatcher), ("worker", worker)):
        logs.append(tmp / f"{kind}.log")
        with open(logs[-1], "wb") as log:
            env = {**environ, serverconfig.CONFIG_ENV: serverconfig.to_json(config)}
            processes.append(subprocess.Popen([str(SERVER_BIN), kind], env=env, stdout=log, stderr=subprocess.STDOUT))
    svc = Service(processes[0], processes[1], dispatcher, worker, logs)
    try:
        wait_for(lambda: svc.signals().workers_answering == 1, START_TIMEOUT, "the worker to answer", 0.5, svc.show)
        yield svc
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass
class Client:
    """A plain ``distribute()`` trainer that reports nothing, as a process; its output timestamped."""

    popen: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)

    @classmethod
    def start(cls, service: Service, delay: float, count: int, job: str | None = None) -> Client:
        address = f"grpc://127.0.0.1:{service.config.port}"
        if job is None:
            args = [CLIENT, address, str(delay), str(count)]
        else:
            args = [REPORTING_CLIENT, address, service.url(signals.REPORT_PATH), job]
        popen = subprocess.Popen(
            [sys.executable, "-c", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        client = cls(popen)
        threading.Thread(target=client._read, daemon=True).start()
        return client

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append((time.monotonic(), line.strip()))

    def elements(self) -> list[float]:
        return [at for at, line in self.lines if line.startswith("element")]

    def wait_elements(self, count: int, timeout: float = START_TIMEOUT) -> float:
        wait_for(lambda: len(self.elements()) >= count, timeout, f"{count} elements", 0.1, lambda: self.lines)
        return self.elements()[count - 1]


def sample_while(service: Service, running: threading.Event) -> list[tuple[float, signals.ServiceSignals]]:
    samples: list[tuple[float, signals.ServiceSignals]] = []

    def run() -> None:
        while running.is_set():
            samples.append((time.monotonic(), service.signals()))
            time.sleep(0.25)

    threading.Thread(target=run, daemon=True).start()
    return samples


def test_idle_before_any_client(service: Service) -> None:
    # The worker's health endpoint answers before its first heartbeat has registered it.
    seen = wait_for(
        service.signals, 30, "the worker registered with the dispatcher", until=lambda s: s.registered_workers == 1
    )
    assert not seen.reading, seen
    assert (seen.registered_workers, seen.workers_answering, seen.worker_tasks) == (1, 1, 0), seen
    assert seen.reporting_clients == 0 and seen.client_stall_fraction_mean is None, seen
    worker = service.metrics(worker=True)
    assert worker["tfdata_worker_tasks"] == 0, worker
    assert worker["tfdata_worker_cpu_seconds_total"] > 0, worker
    assert any(k.startswith("tfdata_worker_cpu_given_cores{") for k in worker), worker
    dispatcher = service.metrics()
    assert dispatcher["tfdata_dispatcher_workers_registered"] == 1, dispatcher
    assert dispatcher["tfdata_dispatcher_reading"] == 0, dispatcher
    assert dispatcher["tfdata_dispatcher_workers_answering"] == 1, dispatcher


def test_a_slow_plain_client_reads_until_its_last_element_then_idle_within_the_bound(service: Service) -> None:
    running = threading.Event()
    running.set()
    samples = sample_while(service, running)
    # Few elements and slow steps: the worker's task ends (all splits handed out) long before the
    # trainer has consumed what it buffered. It is still reading until its last element.
    client = Client.start(service, delay=2.0, count=6)
    first = client.wait_elements(1)
    last = client.wait_elements(6, timeout=60)
    assert client.popen.wait(60) == 0
    ended = time.monotonic()
    idle_after = service.wait_idle(IDLE_BOUND_SECONDS, since=last)
    running.clear()
    busy = [s for at, s in samples if first <= at <= last]
    assert busy, samples
    called_idle = [(round(at - first, 2), s.reasons) for at, s in samples if first <= at <= last and not s.reading]
    assert not called_idle, f"called idle while the client read: {called_idle}"
    print(
        f"\nslow plain client: {len(busy)} samples over {last - first:.1f}s all reading; idle "
        f"{idle_after:.1f}s after its last element ({time.monotonic() - ended:.1f}s after it exited)"
    )
    assert idle_after <= IDLE_BOUND_SECONDS


def test_a_client_killed_without_cleanup_is_forgotten_within_the_bound(service: Service) -> None:
    client = Client.start(service, delay=1.0, count=10_000)
    client.wait_elements(3)
    assert service.signals().reading
    client.popen.kill()  # no iterator cleanup: the dispatcher only sees its heartbeats stop
    client.popen.wait()
    killed = time.monotonic()
    idle_after = service.wait_idle(IDLE_BOUND_SECONDS + 5, since=killed)
    print(f"\nkilled plain client: idle {idle_after:.1f}s after SIGKILL")
    assert idle_after <= IDLE_BOUND_SECONDS


def test_a_reporting_client_reads_until_done_or_its_reports_stop(service: Service) -> None:
    service.report("trainer-a", stall=0.4)
    service.report("trainer-b", stall=0.1)
    seen = service.signals()
    assert seen.reading and seen.reporting_clients == 2, seen
    assert seen.client_stall_fraction_max == pytest.approx(0.4), seen
    assert seen.client_stall_fraction_mean == pytest.approx(0.25), seen
    service.report("trainer-a", done=True)
    assert service.signals().reporting_clients == 1
    service.report("trainer-b", done=True)
    assert not service.signals().reading, service.signals()
    service.report("trainer-c")  # then silence
    stopped = time.monotonic()
    assert service.signals().reading
    forgotten = service.wait_idle(REPORT_TIMEOUT_MS / 1000 + 5, since=stopped)
    print(f"\nsilent reporting client forgotten after {forgotten:.1f}s (client_report_timeout_ms={REPORT_TIMEOUT_MS})")
    assert forgotten >= REPORT_TIMEOUT_MS / 1000 - 0.5


def test_a_reporting_client_and_a_plain_client_are_both_detected(service: Service) -> None:
    client = Client.start(service, delay=1.0, count=10_000)
    client.wait_elements(2)
    # The plain client reports nothing; the dispatcher's journal lists it under its job (without a name).
    (plain,) = service.signals().jobs or ()
    assert (plain.job_name, plain.reporting_clients, plain.attached_clients) == (None, 0, 1), plain
    assert plain.client_stall_fraction_mean is None, plain
    service.report("trainer-r", stall=0.2)
    seen = service.signals()
    assert seen.reading and seen.reporting_clients == 1, seen
    assert any("journal" in reason for reason in seen.reasons), seen.reasons
    assert any("reporting clients" in reason for reason in seen.reasons), seen.reasons
    client.popen.terminate()
    client.popen.wait()
    assert service.signals().reading, "the reporting client still reads"
    service.report("trainer-r", done=True)
    service.wait_idle(IDLE_BOUND_SECONDS, since=time.monotonic())


def test_two_trainers_of_one_job_are_seen_and_one_that_leaves_is_forgotten_within_the_bound(
    service: Service,
) -> None:
    """Two real tf.data trainers read one job (job_name "shared") and report through the helper's
    iterate(): the document lists the job with 2 trainers, both also attached to it by the
    dispatcher's journal, then 1 once one is killed (no cleanup, no ``done``: its reports just
    stop), within client_report_timeout_ms plus a report interval."""

    def job() -> signals.JobReading | None:
        return next((j for j in service.signals().jobs or () if j.job_name == "shared"), None)

    trainers = [Client.start(service, delay=0.2, count=0, job="shared") for _ in range(2)]
    try:
        for trainer in trainers:
            trainer.wait_elements(3)
        both = wait_for(
            job,
            30,
            "the job to list 2 trainers",
            0.25,
            service.show,
            until=lambda j: j is not None and j.reporting_clients == 2 and j.attached_clients == 2,
        )
        assert both is not None and both.client_stall_fraction_max is not None, both
        trainers[0].popen.kill()  # no cleanup: no done report; its reports stop
        trainers[0].popen.wait()
        killed = time.monotonic()
        bound = REPORT_TIMEOUT_MS / 1000 + 2.0  # the timeout, one report interval (1 s) and a poll
        one = wait_for(
            job,
            bound + 5,
            "the job to list 1 trainer",
            0.25,
            service.show,
            until=lambda j: j is not None and j.reporting_clients == 1,
        )
        forgotten = time.monotonic() - killed
        assert trainers[1].popen.poll() is None, "the other trainer still reads"
        assert one is not None and one.reporting_clients == 1 and service.signals().reporting_clients == 1
        print(f"\n2 trainers of one job listed; the killed one forgotten after {forgotten:.1f}s (bound {bound:.0f}s)")
        assert forgotten <= bound
    finally:
        for trainer in trainers:
            if trainer.popen.poll() is None:
                trainer.popen.terminate()
                trainer.popen.wait(30)
    service.wait_idle(IDLE_BOUND_SECONDS, since=time.monotonic())


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "must be a JSON object"),
        (json.dumps({"client_id": "x", "stall_fraction": 0.1}), 400, "missing fields"),
        (json.dumps({"client_id": "x", "stall_fraction": 2, "window_seconds": 5, "elements": 1}), 400, "from 0 to 1"),
        (
            json.dumps({"client_id": "x", "stall_fraction": 0, "window_seconds": 5, "elements": 1, "x": 1}),
            400,
            "unknown",
        ),
        (b"x" * (70 * 1024), 413, "at most"),
    ],
    ids=["not-json", "missing", "out-of-range", "unknown-field", "too-large"],
)
def test_bad_reports_get_the_reason(service: Service, body: bytes | str, status: int, message: str) -> None:
    got, text = service.post(body)
    assert (got, message in text) == (status, True), text


def test_tracked_clients_are_bounded(service: Service) -> None:
    for name in ("b-1", "b-2", "b-3"):
        service.report(name)
    status, text = service.post(signals.ClientReport("b-4", 0.1, 5.0, 1).to_json())
    assert status == 429 and "max_tracked_clients" in text, text
    service.report("b-1")  # a known client still reports
    for name in ("b-1", "b-2", "b-3"):
        service.report(name, done=True)
    assert not service.signals().reading
    assert service.metrics()['tfdata_dispatcher_client_reports_total{result="rejected"}'] >= 1
