"""Pure helpers shared by every test tier: waiting with a timeout, free ports, kubectl, and the
operator as a process. Fixtures built on them live in tests/fixtures (loaded by tests/conftest.py);
no test module imports a `conftest`."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tfdata_operator.wire.signals import ServiceSignals

import devcluster
from fixtures.manifests import service_manifest

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
CRD_DIR = ROOT / "crds"


class Gone(AssertionError):
    """Raised by a probe when what it waits for can no longer happen: ``wait_for`` gives up at once."""


def wait_for(
    probe: Callable[[], T],
    timeout: float,
    what: str,
    interval: float = 0.5,
    show: Callable[[], Any] | None = None,
    until: Callable[[T], bool] = bool,
) -> T:
    """Polls ``probe`` until ``until`` holds for what it returns (by default: it is truthy), and
    returns that; on timeout, fails saying what it last saw (``show()`` if given). A probe that
    raises is retried (it may race with the objects it reads), unless it raises ``Gone``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = probe()
        except Gone as exc:
            raise AssertionError(f"gave up waiting for {what}: {exc}\n{_shown(show() if show else None)}") from None
        except Exception as exc:
            last = exc
        if not isinstance(last, Exception) and until(last):
            return last  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}; last saw: {_shown(show() if show else last)}"
            )
        time.sleep(interval)


def holds_for(
    probe: Callable[[], T], duration: float, what: str, ok: Callable[[T], bool] = bool, interval: float = 0.25
) -> int:
    """Samples ``probe`` for ``duration`` seconds and fails at the first sample for which ``ok``
    is false (or the probe raises), saying what it saw and when: a state that must *stay* true,
    not one reading of it. Returns how many samples held."""
    start = time.monotonic()
    samples = 0
    while True:
        seen = probe()
        if not ok(seen):
            raise AssertionError(f"{what} stopped holding after {time.monotonic() - start:.1f}s: saw {_shown(seen)}")
        samples += 1
        if time.monotonic() - start >= duration:
            return samples
        time.sleep(interval)


def _shown(seen: Any) -> str:
    return seen if isinstance(seen, str) else repr(seen)


def kubelet_nodes(nodes: dict[str, Any]) -> list[str]:
    """The names in a `kubectl get nodes -o json` answer that a kubelet runs: kwok's fake nodes
    (which the integration tier's own cluster has) run nothing."""
    return [n["metadata"]["name"] for n in nodes["items"] if not devcluster.is_kwok_node(n)]


def on_kwok_nodes(*parts: str) -> str:
    """A merge patch for a TFDataService: the pods of `parts` ("dispatcher", "workers") tolerate
    the taint of kwok's nodes, so they are scheduled there and kwok reports them Running and Ready
    as a kubelet would. On a cluster with real nodes the toleration changes nothing."""
    return json.dumps({"spec": {part: {"tolerations": [devcluster.KWOK_TOLERATION]} for part in parts}})


def apply_on_fake_dispatcher(
    kubectl: Kubectl, namespace: str, name: str, dispatcher: Pages, spec: dict[str, Any]
) -> None:
    """Apply TFDataService ``name`` with ``spec``, its dispatcher's health port that of ``dispatcher`` (a
    fake on 127.0.0.1) and its pods on kwok's nodes; skip on a cluster whose kubelets report pod status
    (a pod's address could not be pointed at the fake: patch its podIP to 127.0.0.1 once it runs)."""
    if kubelet_nodes(kubectl.json("get", "nodes")):
        pytest.skip("this cluster's kubelets report pod status, so a pod cannot be pointed at a fake dispatcher")
    port = int(dispatcher.base.rsplit(":", 1)[1])
    manifest: dict[str, Any] = service_manifest(
        name, {**spec, "dispatcher": {**spec.get("dispatcher", {}), "healthPort": port}}, namespace
    )
    for part, fields in json.loads(on_kwok_nodes("dispatcher", "workers"))["spec"].items():
        manifest["spec"][part] = {**manifest["spec"].get(part, {}), **fields}
    kubectl.apply(manifest)


def to_run(*parts: str, priority_class: str | None) -> str:
    """A merge patch for a TFDataService after which the pods of `parts` run. On the node-less
    cluster they tolerate kwok's taint (on_kwok_nodes). On a cluster with kubelets (kind) the
    services a test module applies ask for more CPU than one small node has, so some of their pods
    stay Pending; with `priority_class` (fixtures.cluster's `run_first`) the scheduler places the
    pods of `parts` before those, preempting them when the node is full."""
    patch = json.loads(on_kwok_nodes(*parts))
    if priority_class is not None:
        for part in parts:
            patch["spec"][part]["priorityClassName"] = priority_class
    return json.dumps(patch)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# How kopf's `full` log format (OperatorProcess's) starts a line:
# "[<time>] <logger name, padded to 20> [<LEVEL, padded to 8>] <message>".
_FULL_FORMAT_PREFIX = re.compile(r"^\[[^\]]*\] .{20} \[(?P<level>[A-Z]+) *\] ")


def log_message(line: str) -> str:
    """A line of the operator's log without the time, logger and level kopf's `full` format puts first."""
    return _FULL_FORMAT_PREFIX.sub("", line, count=1)


def logged_errors(log: str) -> list[str]:
    """The lines an operator logged at ERROR level or above, in kopf's `full` format or in `json`
    (the chart's default)."""
    found = []
    for line in log.splitlines():
        if line.startswith("{"):
            try:
                severe = json.loads(line).get("severity") in ("error", "fatal")
            except ValueError:
                severe = False
        else:
            prefix = _FULL_FORMAT_PREFIX.match(line)
            severe = prefix is not None and prefix["level"] in ("ERROR", "CRITICAL")
        if severe:
            found.append(line)
    return found


class OperatorProcess:
    """`tfdata-operator run` as a real process, with its log in a file. No test provokes an ERROR
    line on purpose (a fault point logs a WARNING): ``finish`` fails on any."""

    def __init__(self, env: dict[str, str], log_path: Path, *args: str) -> None:
        self.env = {**env, "PYTHONUNBUFFERED": "1", "TFDATA_RESYNC_SECONDS": env.get("TFDATA_RESYNC_SECONDS", "5")}
        self.env.pop("KUBERNETES_SERVICE_HOST", None)
        self.env.pop("KUBERNETES_SERVICE_PORT", None)
        self.log_path = log_path
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.metrics_port = 0

    def start(self, **env: str) -> OperatorProcess:
        """Starts the operator; ``env`` adds to its environment for this run only (a fault point, say)."""
        self.port, self.metrics_port = free_port(), free_port()
        command = [
            str(Path(sys.executable).with_name("tfdata-operator")),
            "run",
            "--log-format=full",  # with the level, so that `finish` can find every ERROR line
            f"--liveness=http://127.0.0.1:{self.port}/healthz",
            f"--metrics-port={self.metrics_port}",
            "--metrics-address=127.0.0.1",
            *self.args,
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it open
        self.proc = subprocess.Popen(command, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_for(self._alive, 60, "the operator's liveness endpoint", show=self.tail)
        return self

    def _alive(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise Gone(f"the operator exited with {self.proc.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def wait_exit(self, timeout: float) -> int:
        """The exit code of an operator that is expected to stop by itself (at a fault point)."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the operator did not exit within {timeout} s:\n{self.tail()}") from None

    def samples(self) -> list[Sample]:
        """The operator's Prometheus samples, as its /metrics serves them now."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        return [sample for family in text_string_to_metric_families(text) for sample in family.samples]

    def metrics(self) -> dict[str, float]:
        """The operator's Prometheus samples, keyed by name and labels, e.g.
        ``tfdata_operator_leader`` or ``tfdata_operator_api_requests_total{code="200",verb="get"}``."""
        samples = {}
        for sample in self.samples():
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return samples

    def reconciles(self, namespace: str, name: str) -> dict[str, float]:
        """How many reconciles of one TFDataService this process ran, by result (idle, changed, error, ...)."""
        counted = [s for s in self.samples() if s.name == "tfdata_operator_reconciles_total"]
        return {
            s.labels["result"]: s.value
            for s in counted
            if (s.labels["namespace"], s.labels["name"]) == (namespace, name)
        }

    def total(self, prefix: str) -> float:
        """The sum of every sample whose name (with labels) starts with ``prefix``."""
        return sum(v for k, v in self.metrics().items() if k.startswith(prefix))

    def errors(self) -> list[str]:
        """The ERROR and CRITICAL lines of its log."""
        return logged_errors(self.log())

    def finish(self) -> str:
        """Stops the operator with SIGTERM; fails unless it was still running, then exited 0
        (a fatal kopf error, a SIGKILL or an OOM kill is a failure) and logged no traceback and
        no ERROR line. Returns its log."""
        assert self.proc is not None, "the operator was never started"
        died = self.proc.poll()
        code = self.stop()
        log = self.log()
        assert log, f"the operator wrote no log to {self.log_path}"
        assert died is None, f"the operator had exited with {died} before the test ended:\n{self.tail(80)}"
        assert code == 0, f"the operator exited with {code} on SIGTERM:\n{self.tail(80)}"
        assert "Traceback" not in log, self.tail(80)
        errors = self.errors()
        assert not errors, "the operator logged errors:\n" + "\n".join(errors[:20])
        return log

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


class Watch:
    """`kubectl get --watch` on some objects: every version the API server sends, in its order (the
    first ones list what exists), read in a thread of its own until ``stop``."""

    def __init__(self, kubectl: Kubectl, *args: str) -> None:
        self.events: list[dict[str, Any]] = []
        command = [str(kubectl.binary), "get", *args, "--watch", "-o", "json", "--output-watch-events"]
        self.proc = subprocess.Popen(command, env=kubectl.env, stdout=subprocess.PIPE, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        decoder, buffer = json.JSONDecoder(), ""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            buffer += line
            try:
                event, _ = decoder.raw_decode(buffer.strip())
            except json.JSONDecodeError:
                continue
            self.events.append(event["object"])
            buffer = ""

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)


class KubectlError(AssertionError):
    pass


@dataclass(frozen=True)
class Kubectl:
    """The real kubectl binary against a test cluster."""

    binary: Path
    env: dict[str, str]

    def run(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binary), *args],
            input=input,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            # CalledProcessError would hide stderr, which is what explains the failure.
            raise KubectlError(
                f"kubectl {' '.join(args)} exited with {result.returncode}\n"
                f"stdout: {result.stdout}\nstderr: {result.stderr}"
            )
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def apply(self, manifest: dict[str, Any], *args: str) -> Any:
        """`kubectl apply` one object; returns it as the API server stored it."""
        return json.loads(self.run("apply", "-f", "-", "-o", "json", *args, input=json.dumps(manifest)).stdout)

    def get(self, *args: str) -> Any | None:
        """`kubectl get ... -o json`: the object, or None when the API server says NotFound.
        Any other error (a timeout, a refused connection, a 500) fails: it says nothing about
        whether the object is gone."""
        result = self.run("get", *args, "-o", "json", check=False)
        if result.returncode == 0:
            return json.loads(result.stdout)
        if "(NotFound)" in result.stderr:
            return None
        raise KubectlError(f"kubectl get {' '.join(args)} exited with {result.returncode}\nstderr: {result.stderr}")


def service_signals(reading: bool, idle_seconds: float = 0.0, reasons: tuple[str, ...] = ()) -> ServiceSignals:
    """A dispatcher's /v1/signals answer: ``reading`` clients (one attached job unless ``reasons`` say), else idle."""
    if not reasons:
        reasons = ("1 clients attached to jobs (the dispatcher's journal)",) if reading else ("no client reads",)
    return ServiceSignals(
        reading=reading,
        reasons=reasons,
        idle_seconds=idle_seconds,
        registered_workers=2,
        workers_answering=2,
        workers_unreachable=(),
        worker_tasks=2 if reading else 0,
        worker_cpu_utilization_mean=None,
        worker_cpu_utilization_max=None,
        reporting_clients=0,
        client_stall_fraction_mean=None,
        client_stall_fraction_max=None,
        age_seconds=0.5,
    )


class Pages:
    """A real HTTP server on 127.0.0.1 that answers GET ``path`` with ``pages[path]`` (JSON), and 404 otherwise.

    ``statuses[path]`` answers with that status (and an empty body) instead. DELETE ``path`` is
    recorded in ``deleted`` and answered with ``delete_status`` (and ``{}``); ``deletes`` records
    each with what GET ``path`` answered at that moment (None: nothing), so a test can say what
    state the thing was in when it was deleted, not only that it was.
    """

    def __init__(self, pages: dict[str, str], statuses: dict[str, int] | None = None) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.pages = pages
        self.statuses = statuses or {}
        self.requests: list[str] = []
        self.deleted: list[str] = []
        self.deletes: list[tuple[str, str | None]] = []
        self.delete_status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append(self.path)
                body = outer.pages.get(self.path)
                status = outer.statuses.get(self.path, 200 if body is not None else 404)
                self.send_response(status)
                data = (body or "").encode() if status == 200 else b""
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_DELETE(self) -> None:
                outer.deletes.append((self.path, outer.pages.get(self.path)))
                outer.deleted.append(self.path)
                data = b"{}"
                self.send_response(outer.delete_status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def url(self, path: str) -> str:
        return self.base + path

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class WorkerCounts:
    """The service's ready workers over time, as the worker StatefulSet's controller counts them
    (status.readyReplicas), not as the operator's own status tells: polled in the background,
    every 2 s. A poll that fails stops the polling and fails the test at its next reading."""

    def __init__(self, kubectl: Kubectl, namespace: str, name: str) -> None:
        self.kubectl, self.namespace, self.name = kubectl, namespace, name
        self.seen: list[tuple[float, int, int]] = []  # (monotonic time, ready workers, StatefulSet's spec.replicas)
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> WorkerCounts:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        if exc[0] is None:
            self._check()

    def _poll(self) -> None:
        while not self._stop.wait(2.0):
            try:
                sts = self.kubectl.get("statefulset", f"{self.name}-worker", "-n", self.namespace)
                if sts is None:
                    raise AssertionError(f"the StatefulSet {self.name}-worker is gone")
                ready = int(sts.get("status", {}).get("readyReplicas") or 0)
                self.seen.append((time.monotonic(), ready, int(sts["spec"]["replicas"])))
            except subprocess.TimeoutExpired:
                continue  # a slow API server: the next poll tells
            except BaseException as exc:
                self.failure = exc
                return

    def _check(self) -> None:
        if self.failure is not None:
            raise Gone(f"reading the worker StatefulSet failed: {self.failure!r}") from self.failure

    def most_ready(self) -> int:
        self._check()
        return max((ready for _, ready, _ in self.seen), default=0)

    def phases(self, times: list[float]) -> list[tuple[int, float, int]]:
        """(ready workers, seconds, elements read) for each stretch of one count while elements
        arrived, from the first element to the last."""
        if not times:
            return []
        start, end = times[0], times[-1]
        cuts = [(t, ready) for t, ready, _ in self.seen if start < t < end]
        before = [ready for t, ready, _ in self.seen if t <= start]
        spans: list[tuple[int, float, float]] = []
        current, since = (before[-1] if before else 1), start
        for t, ready in cuts:
            if ready != current:
                spans.append((current, since, t))
                current, since = ready, t
        spans.append((current, since, end))
        return [(ready, b - a, sum(1 for t in times if a <= t < b)) for ready, a, b in spans]


def stalled_on_idle_workers_said(signals: dict[str, Any], target_cpu_percent: int) -> bool:
    """Whether a service's ``status.autoscaling.signals`` say a trainer reported waiting on data
    while the workers were far below their CPU target (an I/O-bound pipeline), reading."""
    return (
        signals.get("reportingClients", 0) >= 1
        and signals.get("dataStallPercent", 0) >= 50
        and signals.get("workerCPUPercent", 100) < target_cpu_percent / 2
        and signals.get("elementsPerSecond", 0) > 0
    )
