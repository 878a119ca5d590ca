"""``tfdata-server``'s supervisor without TensorFlow: the CLI, the probes, and a stand-in server process."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tfdata_operator.server import LOGGER_NAME, health, main, probestate
from tfdata_operator.wire import serverconfig, serverinfo
from tfdata_operator.wire.serverconfig import WorkerServerConfig

from fixtures.fakes import Clock


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


WORKER_JSON = serverconfig.to_json(WorkerServerConfig(5051, 8081, "d:5050", "{pod_name}.w:5051"))


# --- the command line ----------------------------------------------------------------------------


def test_help_lists_kinds_and_exit_codes() -> None:
    result = CliRunner().invoke(main.main, ["--help"])
    assert result.exit_code == 0
    assert "Usage: tfdata-server [OPTIONS] {dispatcher|worker}" in result.output
    assert "2  invalid configuration" in result.output


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["worker"], {}, "no configuration: pass --config FILE or set TFDATA_SERVER_CONFIG"),
        (["dispatcher"], {serverconfig.CONFIG_ENV: WORKER_JSON}, "configuration is for a 'worker'"),
        (["worker"], {serverconfig.CONFIG_ENV: WORKER_JSON}, "POD_NAME is not set"),
        (["worker"], {serverconfig.CONFIG_ENV: WORKER_JSON, serverconfig.POD_NAME_ENV: " "}, "POD_NAME is not set"),
        (["worker", "--config", "/nonexistent.json"], {}, "cannot read configuration file /nonexistent.json"),
    ],
    ids=["none", "wrong-kind", "no-pod-name", "blank-pod-name", "missing-file"],
)
def test_bad_configuration_exits_2_with_one_line(args: list[str], env: dict[str, str], message: str) -> None:
    env = {serverconfig.CONFIG_ENV: "", serverconfig.POD_NAME_ENV: "", **env}
    result = CliRunner().invoke(main.main, args, env=env)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("tfdata-server: invalid configuration: ")
    assert message in line


def test_unknown_kind_is_a_usage_error() -> None:
    result = CliRunner().invoke(main.main, ["scheduler"])
    assert result.exit_code == 2
    assert "'scheduler' is not one of 'dispatcher', 'worker'" in result.stderr


def test_config_file_wins_and_worker_gets_its_pod_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "worker.json"
    path.write_text(WORKER_JSON)
    started: list[tuple[str, serverconfig.ServerConfig, str | None]] = []

    def run(self: main.Supervisor) -> int:
        started.append((self.kind, self.config, self.pod_name))
        return 0

    monkeypatch.setattr(main.Supervisor, "run", run)
    env = {serverconfig.CONFIG_ENV: "{not json", serverconfig.POD_NAME_ENV: "w-2"}
    result = CliRunner().invoke(main.main, ["worker", "--config", str(path)], env=env)
    assert result.exit_code == 0, result.output
    [(kind, config, pod_name)] = started
    assert (kind, pod_name) == ("worker", "w-2")
    assert isinstance(config, WorkerServerConfig)
    assert config.worker_address("w-2") == "w-2.w:5051"


def test_dispatcher_needs_no_pod_name() -> None:
    assert main.pod_name_for("dispatcher", {}) is None
    assert main.pod_name_for("worker", {serverconfig.POD_NAME_ENV: "w-0"}) == "w-0"


def test_the_supervisor_never_imports_tensorflow(tmp_path: Path) -> None:
    # In a fresh interpreter: this test session may have imported TensorFlow elsewhere.
    script = textwrap.dedent(
        """
        import sys
        from click.testing import CliRunner
        from tfdata_operator.server import health, main, probestate
        CliRunner().invoke(main.main, ["--help"])
        CliRunner().invoke(main.main, ["worker"], env={"TFDATA_SERVER_CONFIG": ""})
        state = probestate.ProbeState("starting")
        server = health.HealthServer(state, 0, host="127.0.0.1")
        server.start(); server.stop()
        print("tensorflow" in sys.modules)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "False", result.stderr


# --- the probes ----------------------------------------------------------------------------------


def test_probe_state_through_a_servers_life() -> None:
    clock = Clock(100.0)
    state = probestate.ProbeState("worker starting", clock=clock)
    assert state.liveness() == (True, "starting: worker starting")
    assert state.readiness() == (False, "starting: worker starting")

    state.apply(probestate.status_line(probestate.STARTING, False, "registering with dispatcher at d:5050"))
    assert state.readiness() == (False, "starting: registering with dispatcher at d:5050")

    state.apply(probestate.status_line(probestate.RUNNING, True, "registered; 0 tasks"))
    assert state.readiness() == (True, "registered; 0 tasks")

    clock.now += probestate.STALE_AFTER_SECONDS + 1  # the TensorFlow process went silent
    ready, detail = state.readiness()
    assert not ready
    assert "no report from the TensorFlow server for 11s" in detail
    assert state.liveness()[0]

    state.apply(probestate.status_line(probestate.RUNNING, True, "registered; 1 tasks"))
    assert state.readiness() == (True, "registered; 1 tasks")

    state.stopping()
    state.apply(probestate.status_line(probestate.RUNNING, True, "late report"))  # must not revive it
    assert state.readiness() == (False, "stopping: shutting down")
    assert state.liveness() == (True, "stopping: shutting down")


def test_a_failed_server_is_not_alive() -> None:
    state = probestate.ProbeState("starting")
    state.apply(probestate.status_line(probestate.FAILED, False, "worker failed to start: refused"))
    assert state.liveness() == (False, "failed: worker failed to start: refused")
    assert state.readiness() == (False, "failed: worker failed to start: refused")


INFO = serverinfo.ServerInfo(
    tensorflow_version="2.16.2",
    python_version="3.11.7",
    graph_def=serverinfo.GraphDefVersions(1766, 0, 0),
    preloaded=("tensorflow_text",),
    ops=("Abs", "TFText>NgramsStringJoin"),
    preloaded_ops=("TFText>NgramsStringJoin",),
)


def test_a_server_that_cannot_serve_stays_alive_unready_and_says_why() -> None:
    # A restart would fail the same way: no liveness failure, no crash loop; /readyz tells.
    state = probestate.ProbeState("starting")
    why = "preload failed: cannot import tensorflow_text: ModuleNotFoundError: No module named 'tensorflow_text'"
    state.apply(probestate.status_line(probestate.CANNOT_SERVE, False, why, None, INFO))
    state.apply(probestate.status_line(probestate.RUNNING, True, "late report"))  # final: must not revive it
    assert state.readiness() == (False, f"cannot-serve: {why}")
    assert state.liveness() == (True, f"cannot-serve: {why}")
    assert state.info() == INFO


def test_server_info_is_503_until_the_tensorflow_process_measured_it() -> None:
    state = probestate.ProbeState("worker starting")
    reply = state.info_reply()
    assert (reply.status, reply.body) == (503, b"not known yet: starting: worker starting\n")
    state.apply(probestate.status_line(probestate.STARTING, False, "starting the server", None, INFO))
    reply = state.info_reply()
    assert reply.status == 200
    assert reply.content_type == "application/json"
    assert serverinfo.from_json(reply.body) == INFO


def test_malformed_info_is_refused() -> None:
    with pytest.raises(ValueError, match="malformed info in status"):
        probestate.ProbeState("starting").apply('{"phase": "starting", "ready": false, "detail": "", "info": {"x": 1}}')


@pytest.mark.parametrize("line", ["not json", "[1]", '{"phase": "running", "ready": "yes", "detail": ""}'])
def test_malformed_status_is_refused(line: str) -> None:
    with pytest.raises(ValueError):
        probestate.ProbeState("starting").apply(line)


def test_health_server_answers_over_http() -> None:
    state = probestate.ProbeState("dispatcher starting")
    server = health.HealthServer(state, 0, host="127.0.0.1")
    server.start()
    try:
        assert get(server.port, "/healthz") == (200, "starting: dispatcher starting\n")
        assert get(server.port, "/readyz") == (503, "not ok: starting: dispatcher starting\n")
        state.apply(
            probestate.status_line(probestate.RUNNING, True, "dispatcher serving on port 5050; 0 workers registered")
        )
        assert get(server.port, "/readyz") == (200, "dispatcher serving on port 5050; 0 workers registered\n")
        assert get(server.port, "/readyz?verbose=1")[0] == 200
        assert get(server.port, "/metrics")[0] == 404
    finally:
        server.stop()


# --- the supervisor, with a stand-in for the TensorFlow process ----------------------------------

FAKE_SERVER = """
import os, signal, sys, time
pipe = os.fdopen(int(sys.argv[1]), "wb", buffering=0)
def report(phase, ready, detail):
    pipe.write(('{"phase": "%s", "ready": %s, "detail": "%s"}\\n' % (phase, ready, detail)).encode())
behaviour = os.environ["FAKE_BEHAVIOUR"]
report("starting", "false", "registering with dispatcher")
if behaviour == "fail":
    report("failed", "false", "worker failed to start: Failed to assign an index for worker w-9:5051")
    sys.exit(1)
if behaviour == "cannot-serve":
    report("cannot-serve", "false", "preload failed: cannot import tensorflow_text")
    sys.exit(3)
if behaviour == "crash":
    os.kill(os.getpid(), signal.SIGKILL)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    report("running", "true", "registered; " + os.environ["POD_NAME"])
    time.sleep(0.1)
"""


class FakeSupervisor(main.Supervisor):
    def child_command(self, status_fd: int) -> list[str]:
        return [sys.executable, "-c", FAKE_SERVER, str(status_fd)]


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger(LOGGER_NAME)
    logger.addHandler(handler)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield lines
    logger.removeHandler(handler)
    for sig, previous in saved.items():
        signal.signal(sig, previous)


def supervise(behaviour: str, monkeypatch: pytest.MonkeyPatch) -> FakeSupervisor:
    monkeypatch.setenv("FAKE_BEHAVIOUR", behaviour)
    config = WorkerServerConfig(5051, free_port(), "d:5050", "{pod_name}.w:5051")
    return FakeSupervisor("worker", config, "w-0")


def test_server_that_fails_to_start_exits_1_with_its_message(
    log_lines: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    supervisor = supervise("fail", monkeypatch)
    assert supervisor.run() == 1
    message = "worker failed to start: Failed to assign an index for worker w-9:5051"
    assert message in log_lines
    assert supervisor.state.liveness() == (False, f"failed: {message}")


def test_why_a_server_failed_is_its_termination_message(
    log_lines: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The conditions quote the termination message: it says why, not the log's TensorFlow noise."""
    termination_log = tmp_path / "termination-log"
    termination_log.write_text("")  # the kubelet creates it
    monkeypatch.setattr(main, "TERMINATION_LOG", str(termination_log))
    assert supervise("fail", monkeypatch).run() == 1
    assert termination_log.read_text() == "worker failed to start: Failed to assign an index for worker w-9:5051"
    # Outside a pod there is no such file, and none is made.
    monkeypatch.setattr(main, "TERMINATION_LOG", str(tmp_path / "absent"))
    assert supervise("fail", monkeypatch).run() == 1
    assert not (tmp_path / "absent").exists()


def test_server_that_crashes_exits_1(log_lines: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert supervise("crash", monkeypatch).run() == 1
    assert "the TensorFlow worker process exited unexpectedly (signal SIGKILL)" in log_lines


def test_sigterm_stops_the_server_and_exits_0(log_lines: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    supervisor = supervise("serve", monkeypatch)
    seen: list[tuple[int, str]] = []

    def probe_then_terminate() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                seen.append(get(supervisor.config.health_port, "/readyz"))
            except OSError as exc:
                seen.append((0, str(exc)))
            if seen[-1][0] == 200:
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=probe_then_terminate, daemon=True).start()
    assert supervisor.run() == 0, seen
    assert seen[-1] == (200, "registered; w-0\n"), seen
    assert "received SIGTERM; stopping the worker" in log_lines
    assert "the TensorFlow worker process exited (code 0)" in log_lines


def test_server_that_cannot_serve_keeps_answering_until_sigterm(
    log_lines: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    supervisor = supervise("cannot-serve", monkeypatch)
    seen: list[tuple[int, str]] = []

    def probe_then_terminate() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "cannot-serve" not in (seen[-1][1] if seen else ""):
            try:
                seen.append(get(supervisor.config.health_port, "/readyz"))
            except OSError as exc:
                seen.append((0, str(exc)))
            time.sleep(0.05)
        time.sleep(1)  # the TensorFlow process has exited by now: the supervisor must still answer
        seen.append(get(supervisor.config.health_port, "/readyz"))
        seen.append(get(supervisor.config.health_port, "/healthz"))
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=probe_then_terminate, daemon=True).start()
    assert supervisor.run() == 0, seen
    why = "cannot-serve: preload failed: cannot import tensorflow_text"
    assert seen[-2:] == [(503, f"not ok: {why}\n"), (200, f"{why}\n")], seen
    errors = [line for line in log_lines if line.startswith("cannot serve: ")]
    assert len(errors) == 1, log_lines  # logged once, not once per probe or report
    assert "received SIGTERM; stopping the worker" in log_lines
