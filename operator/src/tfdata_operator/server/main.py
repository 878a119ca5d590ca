"""``tfdata-server dispatcher|worker``: the supervisor process of a dispatcher or worker pod.

It reads and checks the configuration (exit 2 when it is unusable), serves the probes,
runs TensorFlow's server in a child process (``tfserver``) and turns SIGTERM/SIGINT into
a clean stop (exit 0). A server that fails to start exits 1 with TensorFlow's message.
It never imports TensorFlow: see ``tfdata_operator.server`` for why.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

import click

import tfdata_operator
from tfdata_operator.server import configure_logging
from tfdata_operator.server.aggregate import Aggregator
from tfdata_operator.server.health import HealthServer
from tfdata_operator.server.inject import OWN_PACKAGE
from tfdata_operator.server.metrics import CpuMeter, ServerCollector, cpu_given, metrics_route
from tfdata_operator.server.probestate import (
    CANNOT_SERVE,
    FAILED,
    STOPPING,
    GetRoute,
    PostRoute,
    ProbeState,
    QueryRoute,
)
from tfdata_operator.server.snapshotproxy import DELETE_TIMEOUT_SECONDS, proxy_route
from tfdata_operator.wire import serverconfig, serverinfo, signals, snapshots

# Below Kubernetes' default terminationGracePeriodSeconds (30s), so we, not the kubelet, end it.
STOP_GRACE_SECONDS = 20.0
EXIT_OK, EXIT_FAILED, EXIT_INVALID_CONFIG = 0, 1, 2
TFSERVER = "tfdata_operator.server.tfserver"
# The container's terminationMessagePath (Kubernetes' default, which the builders keep): the kubelet
# creates it. Text there is the termination message, which the operator's conditions quote
# (plan.diagnose), in place of FallbackToLogsOnError's last 2 KiB of log, which starts with
# TensorFlow's start-up noise and can cut off why the server failed.
TERMINATION_LOG = "/dev/termination-log"
_TERMINATION_MESSAGE_BYTES = 4096  # the kubelet's limit per container


def write_termination_message(text: str, path: str | None = None) -> None:
    """Writes ``text`` where Kubernetes takes the termination message from, when it is there (in a
    pod); elsewhere (a server run by hand) there is no such file and none is created."""
    try:
        fd = os.open(path or TERMINATION_LOG, os.O_WRONLY | os.O_TRUNC)
    except OSError:
        return
    with os.fdopen(fd, "wb") as file:
        file.write(text.encode("utf-8", errors="replace")[:_TERMINATION_MESSAGE_BYTES])


def pod_name_for(kind: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """A worker's own pod name, from which it announces its address; a dispatcher needs none."""
    if kind != "worker":
        return None
    name = environ.get(serverconfig.POD_NAME_ENV, "").strip()
    if not name:
        raise serverconfig.ConfigError(
            f"{serverconfig.POD_NAME_ENV} is not set: a worker announces its address from its pod name "
            "(set it from the pod's metadata.name)"
        )
    return name


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"signal {signal.Signals(-returncode).name}"
    return f"code {returncode}"


class Supervisor:
    """Runs one TensorFlow server process and answers for it."""

    def __init__(self, kind: str, config: serverconfig.ServerConfig, pod_name: str | None) -> None:
        self.kind = kind
        self.config = config
        self.pod_name = pod_name
        self.log = configure_logging()
        self.state = ProbeState(f"{kind} starting")
        self.cpu = CpuMeter(cpu_given(config))
        # The dispatcher alone aggregates: client reports, its workers' numbers, the signals.
        self.aggregator: Aggregator | None = None
        if isinstance(config, serverconfig.DispatcherServerConfig):
            self.aggregator = Aggregator(config, lambda: self.state.stats().get("workers_registered"))
        self._wake = threading.Event()
        self._signals: list[int] = []

    def routes(self) -> tuple[dict[str, GetRoute], dict[str, PostRoute], dict[str, QueryRoute]]:
        """What the health port serves beyond the probes."""
        extra = self.aggregator.metrics if self.aggregator is not None else None
        gets = {
            "/metrics": metrics_route(ServerCollector(self.kind, self.state, self.cpu, extra)),
            serverinfo.INFO_PATH: self.state.info_reply,
        }
        posts: dict[str, PostRoute] = {}
        queries: dict[str, QueryRoute] = {}
        if self.aggregator is not None:
            gets[signals.SIGNALS_PATH] = self.aggregator.signals_route
            posts[signals.REPORT_PATH] = self.aggregator.clients.receive
            queries[snapshots.SNAPSHOTS_PATH] = proxy_route(self.state)  # read in the TensorFlow process
        return gets, posts, queries

    def delete_routes(self) -> dict[str, QueryRoute]:
        """What the health port deletes: a dispatcher's snapshots, in the TensorFlow process."""
        if self.aggregator is None:
            return {}
        return {snapshots.SNAPSHOTS_PATH: proxy_route(self.state, DELETE_TIMEOUT_SECONDS, method="DELETE")}

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        gets, posts, queries = self.routes()
        deletes = self.delete_routes()
        try:
            health = HealthServer(
                self.state,
                self.config.health_port,
                get_routes=gets,
                post_routes=posts,
                query_routes=queries,
                delete_routes=deletes,
            )
        except OSError as exc:
            self.log.error("cannot serve the probes on port %d: %s", self.config.health_port, exc.strerror)
            return EXIT_FAILED
        health.start()
        served = ", ".join(
            sorted([*gets, *queries, "/healthz", "/readyz"])
            + [f"POST {p}" for p in posts]
            + [f"DELETE {p}" for p in deletes]
        )
        self.log.info("health port listening on 0.0.0.0:%d (%s)", health.port, served)
        if self.aggregator is not None:
            self.aggregator.start()
        try:
            child = self._start_child()
            while not self._wake.wait(0.5):
                pass
            if self._signals:
                return self._stop(child)
            return self._child_ended(child)
        finally:
            if self.aggregator is not None:
                self.aggregator.stop()
            health.stop()
            self.log.info("health probes stopped")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)
        self._wake.set()

    def child_command(self, status_fd: int) -> list[str]:
        """The TensorFlow process: this interpreter running ``tfserver`` as ``-m`` would.

        As the injected program (``inject``) does in ours: this package is loaded from the
        directory ours came from, whatever copy the image holds, and that directory's parent goes
        last on the child's sys.path, so the image's own packages stay first and a package found
        only there (an injected dependency) is found by the child too (PYTHONPATH would put it first).
        """
        package = Path(tfdata_operator.__file__).resolve().parent
        run = (
            f"{OWN_PACKAGE}\nload_own_package({str(package)!r})\nsys.path.append({str(package.parent)!r})\n"
            f"import runpy\nrunpy.run_module({TFSERVER!r}, run_name='__main__')\n"
        )
        return [sys.executable, "-c", run, self.kind, "--status-fd", str(status_fd)]

    def _start_child(self) -> subprocess.Popen[bytes]:
        read_fd, write_fd = os.pipe()
        env = dict(os.environ)
        env[serverconfig.CONFIG_ENV] = serverconfig.to_json(self.config)  # also when it came from --config
        if self.pod_name is not None:
            env[serverconfig.POD_NAME_ENV] = self.pod_name
        try:
            child = subprocess.Popen(self.child_command(write_fd), env=env, pass_fds=(write_fd,))
        finally:
            os.close(write_fd)
        self.cpu.attach(child.pid)
        self.log.info("started the TensorFlow %s process (pid %d)", self.kind, child.pid)
        threading.Thread(target=self._read_status, args=(read_fd,), name="status", daemon=True).start()
        return child

    def _read_status(self, read_fd: int) -> None:
        was_ready = False
        with open(read_fd, "rb") as pipe:
            for line in pipe:
                self.cpu.sample()  # a line comes every second while TensorFlow runs
                try:
                    self.state.apply(line)
                except ValueError as exc:
                    self.log.warning("ignored a status report: %s", exc)
                    continue
                if self.state.phase == CANNOT_SERVE:
                    self.log.error(
                        "cannot serve: %s (not restarting: that would fail the same way; the pod stays unready "
                        "until its spec changes)",
                        self.state.detail,
                    )
                    break
                ready, detail = self.state.readiness()
                if ready != was_ready and self.state.phase not in (STOPPING, FAILED):
                    if ready:
                        self.log.info("ready: %s", detail)
                    else:
                        self.log.warning("not ready: %s", detail)
                    was_ready = ready
        if self.state.phase != CANNOT_SERVE:
            self._wake.set()  # end of the pipe: the TensorFlow process has ended

    def _stop(self, child: subprocess.Popen[bytes]) -> int:
        self.log.info("received %s; stopping the %s", signal.Signals(self._signals[0]).name, self.kind)
        self.state.stopping()
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                self.log.warning("the %s did not stop within %.0fs; killing it", self.kind, STOP_GRACE_SECONDS)
                child.kill()
                child.wait()
        self.log.info("the TensorFlow %s process exited (%s)", self.kind, _describe_exit(child.returncode))
        return EXIT_OK

    def _child_ended(self, child: subprocess.Popen[bytes]) -> int:
        try:
            child.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:  # it closed the pipe but lives on: end it
            child.kill()
            child.wait()
        if self.state.phase != FAILED:
            self.state.failed(
                f"the TensorFlow {self.kind} process exited unexpectedly ({_describe_exit(child.returncode)})"
            )
        self.log.error("%s", self.state.detail)
        write_termination_message(self.state.detail)
        return EXIT_FAILED


@click.command(name="tfdata-server", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("kind", type=click.Choice(["dispatcher", "worker"]))
@click.option(
    "--config",
    "config_path",
    metavar="FILE",
    help=f"The server configuration (JSON). Default: the {serverconfig.CONFIG_ENV} environment variable.",
)
def main(kind: str, config_path: str | None) -> None:
    """Run a tf.data service dispatcher or worker, with /healthz and /readyz probes.

    A worker announces the address made from its pod name (the POD_NAME environment
    variable). SIGTERM or SIGINT stops the server cleanly.

    \b
    Exit codes:
      0  stopped by SIGTERM or SIGINT
      1  the server failed
      2  invalid configuration
      3  the image cannot run the server (its Python or TensorFlow; checked by
         the program injected into an image of the user's)

    A preload that fails leaves the server running but never ready: /readyz says why.
    """
    try:
        config = serverconfig.load(kind, config_path)
        pod_name = pod_name_for(kind)
    except serverconfig.ConfigError as exc:
        click.echo(f"tfdata-server: invalid configuration: {exc}", err=True)
        sys.exit(EXIT_INVALID_CONFIG)
    sys.exit(Supervisor(kind, config, pod_name).run())
