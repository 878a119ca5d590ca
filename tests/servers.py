"""The tf.data server program in tests: the TensorFlows it runs on, its processes and their probes.

The TensorFlows the server tier runs the server program and its tf.data clients on:

- The project's `.venv` (the pinned TensorFlow 2.21): `tfdata-server` is installed there.
- `.venv-tf2.16` (`make venv-oldest`): an image of the user's on the oldest TensorFlow supported
  (serverconfig.OLDEST_TENSORFLOW), TensorFlow and tensorflow-text and nothing of ours. The server
  program is injected into it as the operator does (`python -m tfdata_operator.server.inject DIR`
  from the operator's Python, here the `.venv`'s) and runs as `python DIR/tfdata-server`.

`make test-server-oldest` sets SERVER_PYTHON_ENV to `.venv-tf2.16`'s Python: tests/server's servers
and clients then run there (`server_tensorflow`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from tfdata_operator.server import inject
from tfdata_operator.wire import serverconfig, serverinfo

from fixtures.tiers import SERVER_OLDEST_ENV as SERVER_PYTHON_ENV

ROOT = Path(__file__).resolve().parents[1]
CURRENT_PYTHON = Path(sys.executable)
OLDEST_PYTHON = ROOT / ".venv-tf2.16" / "bin" / "python"


@dataclass(frozen=True)
class ServerTensorFlow:
    """A Python with TensorFlow, and how the server program runs on it."""

    python: Path
    injected: Path | None = None  # the injected program's directory; None: the installed tfdata-server

    def server_command(self, kind: str) -> list[str]:
        if self.injected is None:
            return [str(self.python.parent / "tfdata-server"), kind]
        return [str(self.python), str(self.injected / inject.PROGRAM), kind]

    def graph_def(self) -> serverinfo.GraphDefVersions:
        """This TensorFlow's GraphDef versions, as a trainer on it has them."""
        code = (
            "import json, tensorflow as tf; v = tf.version; print(json.dumps([v.GRAPH_DEF_VERSION, "
            "v.GRAPH_DEF_VERSION_MIN_CONSUMER, v.GRAPH_DEF_VERSION_MIN_PRODUCER]))"
        )
        result = subprocess.run(
            [str(self.python), "-c", code], capture_output=True, text=True, timeout=120, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"{self.python} could not tell its GraphDef versions: {result.stderr[-2000:]}")
        return serverinfo.GraphDefVersions(*json.loads(result.stdout.strip().splitlines()[-1]))


def require(python: Path) -> Path:
    if not python.exists():
        raise RuntimeError(f"{python} is missing: run `make venv-oldest` (a TensorFlow 2.16 image stand-in)")
    return python


def inject_into(target: Path) -> Path:
    """The server program injected into ``target``, by the operator's Python (this one)."""
    result = subprocess.run(
        [sys.executable, "-m", serverconfig.INJECT_MODULE, str(target)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{serverconfig.INJECT_MODULE} failed: {result.stderr}")
    return target


def injected_on(python: Path, directory: Path) -> ServerTensorFlow:
    return ServerTensorFlow(require(python), inject_into(directory))


def server_tensorflow(directory: Path) -> ServerTensorFlow:
    """Where tests/server runs its servers: SERVER_PYTHON_ENV's Python, injected; else the `.venv`."""
    python = os.environ.get(SERVER_PYTHON_ENV)
    if not python:
        return ServerTensorFlow(CURRENT_PYTHON)
    return injected_on(Path(python), directory)


TRACEBACK = "Traceback (most recent call last)"
# Starting takes one TensorFlow import (a few seconds); a worker's registration retries back off.
START_TIMEOUT = 60.0
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_config(dispatcher_port: int, port: int | None = None) -> serverconfig.WorkerServerConfig:
    """A worker of the dispatcher on ``dispatcher_port`` here, announced as ``{pod_name}:<port>``."""
    port = port or free_port()
    return serverconfig.WorkerServerConfig(
        port=port,
        health_port=free_port(),
        dispatcher_address=f"127.0.0.1:{dispatcher_port}",
        worker_address_format=f"{serverconfig.POD_NAME_PLACEHOLDER}:{port}",
        heartbeat_interval_ms=1000,
    )


def wait_for(what: str, check: Callable[[], T | None], seen: Callable[[], str], timeout: float) -> T:
    """Polls ``check`` until it returns a value; on timeout fails with what was last seen."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {seen()}")
        time.sleep(0.1)


@dataclass
class ServerProcess:
    """One ``tfdata-server`` process, its probes and its log."""

    kind: str
    config: serverconfig.ServerConfig
    popen: subprocess.Popen[bytes]
    log_path: Path
    pod_name: str | None = None
    last_probe: dict[str, str] = field(default_factory=dict)
    # Set once the test stopped it or waited for it to exit: then its end is the test's to check.
    ended_by_test: bool = False

    def probe(self, path: str) -> tuple[int | None, str]:
        """(HTTP status, body) of a probe; (None, why) when nothing answers."""
        url = f"http://127.0.0.1:{self.config.health_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                result: tuple[int | None, str] = (response.status, response.read().decode())
        except urllib.error.HTTPError as exc:
            result = (exc.code, exc.read().decode())
        except (urllib.error.URLError, OSError) as exc:
            result = (None, str(exc))
        self.last_probe[path] = f"{result[0]} {result[1].strip()!r}"
        return result

    def wait_probe(self, path: str, code: int, timeout: float = START_TIMEOUT, contains: str = "") -> str:
        """Waits until ``path`` answers ``code`` (with ``contains`` in the body); returns the body."""

        def check() -> str | None:
            if self.popen.poll() is not None:
                pytest.fail(f"{self.kind} exited with {self.popen.returncode} while waiting for {path}:\n{self.log()}")
            status, body = self.probe(path)
            return body if status == code and contains in body else None

        return wait_for(
            f"{self.kind} {path} to answer {code}" + (f" with {contains!r}" if contains else ""),
            check,
            lambda: f"{self.last_probe.get(path)}\n--- {self.kind} log ---\n{self.log()}",
            timeout,
        )

    def wait_exit(self, timeout: float) -> int:
        self.ended_by_test = True
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.kind} still running after {timeout:.0f}s\n--- log ---\n{self.log()}")

    def terminate(self, timeout: float = 30.0) -> int:
        self.popen.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def unhealthy(self) -> str | None:
        """Why this server is not as a test that did not stop it should leave it: it exited, or its
        log holds a Python traceback; None when it is fine."""
        why = []
        if not self.ended_by_test and self.popen.poll() is not None:
            why.append(f"exited with {self.popen.returncode}, though no test stopped it")
        log = self.log()
        if TRACEBACK in log:
            why.append("logged a traceback")
        if not why:
            return None
        tail = log[log.index(TRACEBACK) :] if TRACEBACK in log else log
        name = f"{self.kind} {self.pod_name}" if self.pod_name else self.kind
        return f"{name} ({self.log_path}) {' and '.join(why)}:\n{tail[-3000:]}"


Launch = Callable[..., ServerProcess]


def launcher(tmp_path_factory: pytest.TempPathFactory, server_tf: ServerTensorFlow) -> Iterator[Launch]:
    """Starts ``tfdata-server`` processes on ``server_tf``; at the end, fails when one that no test
    stopped is not running, or when one logged a traceback (tests review N5), and kills every one."""
    started: list[ServerProcess] = []

    def launch(
        config: serverconfig.ServerConfig,
        pod_name: str | None = None,
        via_file: bool = False,
        env: dict[str, str] | None = None,
    ) -> ServerProcess:
        kind = "dispatcher" if isinstance(config, serverconfig.DispatcherServerConfig) else "worker"
        workdir = tmp_path_factory.mktemp(kind)
        environ = {"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "1", **(env or {})}
        argv = server_tf.server_command(kind)
        if via_file:
            config_file = workdir / "config.json"
            config_file.write_text(serverconfig.to_json(config))
            argv += ["--config", str(config_file)]
        else:
            environ[serverconfig.CONFIG_ENV] = serverconfig.to_json(config)
        if pod_name is not None:
            environ[serverconfig.POD_NAME_ENV] = pod_name
        log_path = workdir / "server.log"
        with open(log_path, "wb") as log:
            # A session of its own: the end of the module kills its TensorFlow child with it.
            popen = subprocess.Popen(argv, env=environ, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        process = ServerProcess(kind, config, popen, log_path, pod_name)
        started.append(process)
        return process

    yield launch
    unhealthy = [why for why in (process.unhealthy() for process in started) if why]
    for process in started:
        # The whole group: the TensorFlow child gets SIGTERM when its supervisor dies (PR_SET_PDEATHSIG),
        # but a worker whose dispatcher is gone can take its dispatcher_timeout_ms to stop (an hour).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.popen.pid, signal.SIGKILL)
        process.popen.wait()
    if unhealthy:
        pytest.fail("\n\n".join(unhealthy), pytrace=False)
