"""The TensorFlow side of ``tfdata-server``: the process that imports TensorFlow (here, and in
``tfconfig`` and ``tffiles``, which only this calls).

It maps a ``serverconfig`` model onto TensorFlow's own ``DispatcherConfig`` /
``WorkerConfig`` protos (``tfconfig``), starts the server and reports readiness to the supervisor
(``main``), which starts it as ``python -m tfdata_operator.server.tfserver KIND --status-fd N``
with the validated configuration in ``TFDATA_SERVER_CONFIG``.

Before the server starts it imports the configured preload modules and loads the op libraries
(a failure leaves the pod alive and unready, saying why: ``probestate.CANNOT_SERVE``), then measures
a ``serverinfo.ServerInfo`` (TensorFlow, GraphDef versions, every registered op) and hands it to
the supervisor, which serves it. It runs on TensorFlow 2.16 (``serverconfig.OLDEST_TENSORFLOW``)
through the pinned 2.21: a setting an older TensorFlow's config protos lack is left out and logged.

Readiness, as TensorFlow 2.21 behaves:

- a worker's ``start()`` returns only once the dispatcher has accepted its heartbeat
  (it retries for as long as the dispatcher is unreachable, and fails at once when the
  dispatcher refuses it, e.g. an address missing from the static worker list), so a
  worker is ready once ``start()`` has returned;
- a dispatcher's ``start()`` returns once its journal is replayed; it is ready while
  ``_num_workers()`` answers, which goes through the gRPC service implementation, and, with
  a static worker list, once exactly the listed workers are registered.
  (``_num_workers()`` on a server not yet started crashes the process with a segmentation
  fault, since the service object does not exist yet: it is only called once ``start()`` has
  returned.)
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import logging
import os
import platform
import signal
import sys
import threading
from typing import Protocol

from tfdata_operator.server import bootstrap, configure_logging, owner
from tfdata_operator.server.health import HealthServer
from tfdata_operator.server.probestate import CANNOT_SERVE, FAILED, RUNNING, STARTING, ProbeState, status_line
from tfdata_operator.server.snapshots import SnapshotReader
from tfdata_operator.server.tfconfig import dispatcher_config_proto, worker_config_proto
from tfdata_operator.server.tffiles import GFileSystem, forget_finished_snapshots, prune_old_journals
from tfdata_operator.wire import serverconfig, serverinfo, snapshots
from tfdata_operator.wire.serverconfig import DispatcherServerConfig, WorkerServerConfig

REPORT_INTERVAL_SECONDS = 1.0
# The TensorFlow process's exit code when it cannot serve; the supervisor stays, unready.
EXIT_CANNOT_SERVE = 3


class Report(Protocol):
    """Sends one status report to the supervisor: see probestate.status_line."""

    def __call__(
        self,
        phase: str,
        ready: bool,
        detail: str,
        stats: dict[str, float] | None = None,
        info: serverinfo.ServerInfo | None = None,
        snapshots_port: int | None = None,
    ) -> None: ...


def registered_ops() -> set[str]:
    """Every op this process's TensorFlow has registered, a loaded library's too.

    TensorFlow's C API ``TF_GetAllOpList`` (the op registry itself: ``tf.raw_ops`` lists only
    the ops TensorFlow generated Python wrappers for, never a library's).
    """
    from tensorflow.core.framework import op_def_pb2
    from tensorflow.python.client import _pywrap_tf_session as c_api  # type: ignore[import-untyped]

    buffer = c_api.TF_GetAllOpList()
    try:
        ops = op_def_pb2.OpList.FromString(c_api.TF_GetBuffer(buffer))
    finally:
        c_api.TF_DeleteBuffer(buffer)
    return {op.name for op in ops.op}


def preload(config: serverconfig.ServerConfig) -> tuple[tuple[str, ...], str | None]:
    """Imports the preload modules, then loads the op libraries, in order.

    Returns what was preloaded and, when one failed, what to tell (the rest is not tried).
    """
    import tensorflow as tf

    done: list[str] = []
    for module in config.preload_modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # anything a module's import raises, ImportError the likeliest
            return tuple(done), f"preload failed: cannot import {module}: {type(exc).__name__}: {exc}"
        done.append(module)
    for path in config.preload_op_libraries:
        try:
            tf.load_op_library(path)
        except Exception as exc:  # tf.errors.NotFoundError for a missing file or symbol
            return tuple(done), f"preload failed: cannot load the op library {path}: {type(exc).__name__}: {exc}"
        done.append(path)
    return tuple(done), None


def measure(preloaded: tuple[str, ...], ops_before: set[str]) -> serverinfo.ServerInfo:
    """This process's ServerInfo, once its preloads are done."""
    import tensorflow as tf

    ops = registered_ops()
    return serverinfo.ServerInfo(
        tensorflow_version=tf.__version__,
        python_version=platform.python_version(),
        graph_def=serverinfo.GraphDefVersions(
            producer=tf.version.GRAPH_DEF_VERSION,
            min_consumer=tf.version.GRAPH_DEF_VERSION_MIN_CONSUMER,
            min_producer=tf.version.GRAPH_DEF_VERSION_MIN_PRODUCER,
        ),
        preloaded=preloaded,
        ops=tuple(sorted(ops)),
        preloaded_ops=tuple(sorted(ops - ops_before)),
    )


def describe(info: serverinfo.ServerInfo) -> str:
    preloaded = f", {len(info.preloaded_ops)} by the preloads ({', '.join(info.preloaded)})" if info.preloaded else ""
    return (
        f"TensorFlow {info.tensorflow_version} (Python {info.python_version}, GraphDef version "
        f"{info.graph_def.producer}): {len(info.ops)} ops registered{preloaded}"
    )


def _dispatcher_summary(config: DispatcherServerConfig) -> str:
    if config.worker_addresses is None:
        workers = "workers register dynamically"
    else:
        count = len(config.worker_addresses)
        workers = f"{count} static worker{'' if count == 1 else 's'}"
    mode = f"work_dir={config.work_dir or '-'}, fault_tolerant_mode={config.fault_tolerant_mode}"
    return f"port {config.port} ({mode}, {workers})"


class _Server:
    """A TensorFlow server, what to log about it, and whether it serves."""

    def __init__(self, config: serverconfig.ServerConfig, pod_name: str | None) -> None:
        import tensorflow as tf  # type: ignore[import-untyped]

        service = tf.data.experimental.service
        self.config = config
        if isinstance(config, DispatcherServerConfig):
            self.kind = "dispatcher"
            self.server = service.DispatchServer(dispatcher_config_proto(config), start=False)
            summary = _dispatcher_summary(config)
            replay = f", replaying the journal in {config.work_dir}" if config.fault_tolerant_mode else ""
            self.starting = f"dispatcher starting on {summary}{replay}"
            self.started = f"dispatcher listening on {summary}"
        else:
            assert pod_name is not None, "main() checks that a worker has a pod name"
            self.kind = "worker"
            self.server = service.WorkerServer(worker_config_proto(config, pod_name), start=False)
            self.registered = (
                f"registered with dispatcher at {config.dispatcher_address} as {config.worker_address(pod_name)}"
            )
            self.starting = (
                f"worker registering with dispatcher at {config.dispatcher_address} as "
                f"{config.worker_address(pod_name)} (waits until the dispatcher accepts this worker)"
            )
            self.started = f"worker listening on port {config.port}, {self.registered}"

    def status(self) -> tuple[bool, str, dict[str, float]]:
        """Asks the running server itself (never call before start() has returned).

        Returns readiness, what to say about it, and the numbers the supervisor serves
        in /metrics (see ``metrics``).
        """
        try:
            if isinstance(self.config, DispatcherServerConfig):
                addresses = self.config.worker_addresses
                of = f" of {len(addresses)}" if addresses is not None else ""
                registered = self.server._num_workers()
                stats = {"workers_registered": float(registered)}
                detail = f"dispatcher serving on port {self.config.port}; {registered}{of} workers registered"
                if addresses is not None and registered > len(addresses):
                    # Its journal remembers workers outside the static list: TensorFlow would fail
                    # every new static job ("Worker ... is not in the workers list").
                    return False, f"{detail}: the journal holds workers missing from the static list", stats
                if addresses is not None and registered < len(addresses):
                    # A static job started now would shard over the registered workers only, and
                    # silently skip the shards of the rest. Workers (re)register on their heartbeat.
                    return False, f"{detail}: waiting for every listed worker to register", stats
                return True, detail, stats
            tasks = self.server._num_tasks()
            return True, f"{self.registered}; {tasks} tasks", {"tasks": float(tasks)}
        except Exception as exc:  # TensorFlow raises plain RuntimeError and OpError alike
            return False, f"{self.kind} not answering: {exc}", {}


def serve_snapshots(config: DispatcherServerConfig) -> HealthServer:
    """The dispatcher's snapshot progress (and deletion) on a port of 127.0.0.1, for the supervisor
    to forward ``/v1/snapshots`` to (``snapshotproxy.proxy_route``); the probes it also answers are unused."""
    reader = SnapshotReader(GFileSystem(), config.work_dir, config.snapshot_dir)
    server = HealthServer(
        ProbeState("snapshots"),
        0,
        host="127.0.0.1",
        query_routes={snapshots.SNAPSHOTS_PATH: reader.route},
        delete_routes={snapshots.SNAPSHOTS_PATH: reader.delete_route},
    )
    server.start()
    return server


def run(kind: str, config: serverconfig.ServerConfig, pod_name: str | None, report: Report) -> int:
    """Starts the server, reports until SIGTERM, stops it; returns the exit code."""
    log = configure_logging()
    # Until start() returns, SIGTERM keeps its default action: start() holds the GIL, so a
    # Python handler could not run, and there is nothing to stop cleanly yet. SIGINT (a
    # terminal's ^C reaches both processes) is the supervisor's to handle.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    report(STARTING, False, "importing TensorFlow", None)
    try:
        import tensorflow as tf
    except ImportError as exc:
        report(FAILED, False, f"TensorFlow is not installed (install tfdata-operator[server]): {exc}", None)
        return 1
    # The injected program told the version from the metadata, when there was any; this is certain.
    problem = bootstrap.image_problem(True, lambda: ("tensorflow", tf.__version__))
    if problem is not None:
        report(CANNOT_SERVE, False, problem, None)
        return EXIT_CANNOT_SERVE
    ops_before = registered_ops()
    preloaded, problem = preload(config)
    info = measure(preloaded, ops_before)
    log.info("%s", describe(info))
    if problem is not None:
        report(CANNOT_SERVE, False, problem, None, info)
        return EXIT_CANNOT_SERVE
    report(STARTING, False, "starting the server", None, info)
    if isinstance(config, DispatcherServerConfig) and config.owner and config.owner_marker:
        # Before anything reads or rewrites a journal there (replay, forget_finished_snapshots, pruning).
        with contextlib.suppress(Exception):  # a new service's: else claim() says what failed
            tf.io.gfile.makedirs(config.owner_marker.rsplit("/", 1)[0])
        refused = owner.claim(GFileSystem(), config.owner_marker, config.owner, log)
        if refused is not None:
            report(FAILED, False, refused, None)
            return 1
    try:
        server = _Server(config, pod_name)
    except Exception as exc:  # TensorFlow rejecting its configuration
        report(FAILED, False, f"{kind} failed to start: {exc}", None)
        return 1
    if isinstance(config, DispatcherServerConfig) and config.fault_tolerant_mode and config.work_dir:
        forget_finished_snapshots(config.work_dir, log)
    log.info("%s", server.starting)
    report(STARTING, False, server.starting, None)
    try:
        server.server.start()
    except Exception as exc:
        report(FAILED, False, f"{kind} failed to start: {exc}", None)
        return 1
    return _serve(kind, config, server, report, log)


def _serve(kind: str, config: serverconfig.ServerConfig, server: _Server, report: Report, log: logging.Logger) -> int:
    """The started server: reports until SIGTERM (or until the supervisor is gone), with the dispatcher's
    journals pruned and its snapshot progress served meanwhile, then stops it."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    log.info("%s", server.started)
    if isinstance(config, DispatcherServerConfig) and config.prune_old_journals:
        prune_old_journals(config, log)
    snapshot_server = None
    if isinstance(config, DispatcherServerConfig):
        try:
            snapshot_server = serve_snapshots(config)
        except OSError as exc:  # the dispatcher serves on: only /v1/snapshots answers 503
            log.warning("cannot serve snapshot progress on 127.0.0.1: %s", exc)
    snapshots_port = snapshot_server.port if snapshot_server is not None else None
    while not stop.is_set():
        try:
            report(RUNNING, *server.status(), snapshots_port=snapshots_port)
        except BrokenPipeError:
            log.warning("the supervisor is gone; stopping the %s", kind)
            break
        stop.wait(REPORT_INTERVAL_SECONDS)
    log.info("stopping the %s", kind)
    if snapshot_server is not None:
        snapshot_server.stop()
    server.server.stop()
    log.info("%s stopped", kind)
    return 0


def _die_with_parent() -> None:
    """Linux: get SIGTERM when the supervisor dies, even while start() blocks."""
    pr_set_pdeathsig = 1
    # Elsewhere there is no prctl: the status pipe still ends the server once it runs.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfdata_operator.server.tfserver")
    parser.add_argument("kind", choices=["dispatcher", "worker"])
    parser.add_argument("--status-fd", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent()
    with open(args.status_fd, "wb", buffering=0) as pipe:

        def report(
            phase: str,
            ready: bool,
            detail: str,
            stats: dict[str, float] | None = None,
            info: serverinfo.ServerInfo | None = None,
            snapshots_port: int | None = None,
        ) -> None:
            pipe.write(status_line(phase, ready, detail, stats, info, snapshots_port))

        # The supervisor validated both already: these fail only when started by hand.
        try:
            config = serverconfig.load(args.kind)
        except serverconfig.ConfigError as exc:
            report(FAILED, False, f"invalid configuration: {exc}")
            return 2
        pod_name = os.environ.get(serverconfig.POD_NAME_ENV)
        if isinstance(config, WorkerServerConfig) and not pod_name:
            report(FAILED, False, f"invalid configuration: {serverconfig.POD_NAME_ENV} is not set")
            return 2
        return run(args.kind, config, pod_name, report)


if __name__ == "__main__":
    code = main()
    # Past a clean stop nothing is left to save (the journal is synced on every write), and
    # TensorFlow's interpreter teardown takes ~5 s, which every pod restart of a rescale would
    # wait for (and can segfault: TensorFlow issue #113163).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
