"""The configuration a dispatcher or worker pod runs with: one typed model for both sides.

The operator's builders write it (as JSON in the pod template) and ``tfdata-server``
reads it, so the writer and the reader cannot drift apart. This module must stay free
of TensorFlow and of the Kubernetes client: it is imported by both processes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The environment variable holding the JSON configuration in the pod template.
CONFIG_ENV = "TFDATA_SERVER_CONFIG"
# The environment variable holding the pod's own name (a fieldRef to metadata.name).
POD_NAME_ENV = "POD_NAME"
# The environment variable holding the pod's namespace (a fieldRef to metadata.namespace).
POD_NAMESPACE_ENV = "POD_NAMESPACE"
# The placeholder in ``WorkerServerConfig.worker_address_format`` replaced by the pod name.
POD_NAME_PLACEHOLDER = "{pod_name}"
# The names of a static dispatcher's journal directories under the service's workDir:
# ``<N>-workers-g<generation>`` (``<N>-workers`` from earlier operator versions).
STATIC_JOURNAL_NAME = re.compile(r"[0-9]+-workers(-g[0-9]+)?")
# DispatcherServerConfig.snapshot_dir: what spec.snapshots.directory takes (api/spec/snapshots.py).
SNAPSHOT_DIR = re.compile(r"(/|[a-z][a-z0-9+.-]*://)\S*")
# The file in a user's workDir (the journal base: a static journal's parent) naming the service
# that journals there, as ``<namespace>/<name>``: a dispatcher refuses a workDir another service owns.
OWNER_MARKER_NAME = "tfdata-owner"
# The directory in a work_dir where TensorFlow's fault-tolerant dispatcher keeps its journal.
JOURNAL_DIR_NAME = "tf_data_dispatcher_journal"
# DispatcherServerConfig.owner: a namespace and a TFDataService name (DNS labels and subdomains).
OWNER = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


# The server program brought into a pod whose image is the user's (spec.serverProgram Injected):
# an init container runs ``python3 -m INJECT_MODULE INJECT_MOUNT`` from the operator's image,
# which copies the pure-Python server and its dependencies there; the server container runs
# ``python3 INJECTED_PROGRAM <kind>``, which loads this package from there whatever the image
# holds, appends the directory to sys.path for the rest (the image's own packages stay first)
# and checks the image can serve before anything else.
INJECT_MOUNT = "/opt/tfdata"
INJECT_MODULE = "tfdata_operator.server.inject"
INJECTED_PROGRAM = f"{INJECT_MOUNT}/tfdata-server"
# The oldest Python and TensorFlow the server program runs on (tests/server proves both).
OLDEST_PYTHON = (3, 10)
OLDEST_TENSORFLOW = (2, 16)
# The exit code of a server whose image cannot serve (no TensorFlow, one too old, a Python
# too old): the message says what to change, and the operator's conditions quote it.
EXIT_UNSUPPORTED_IMAGE = 3


class ConfigError(ValueError):
    """A server configuration that cannot be used; the message says what to fix."""


# What the server program runs with where the configuration leaves a setting unset (None).
# TensorFlow's own defaults (10 min GC checks, 5 min GC timeout, 5 min client timeout, 30 s
# worker heartbeat; DYNAMIC jobs never collected) keep a finished or vanished client's tasks
# on the workers for up to 15 minutes, or forever, and while a task is there nothing can tell
# that no client reads. These make "is any client reading?" turn false within ~25 s of the
# last reader (docs/concepts.md, "Is any client reading?"), at a cost measured in benchmarks/bench_heartbeat.py.
DEFAULTS: dict[str, int | bool] = {
    "job_gc_check_interval_ms": 1_000,
    "job_gc_timeout_ms": 5_000,
    # A client's heartbeat thread beats every second, also while its training loop is slow.
    "client_timeout_ms": 10_000,
    # DYNAMIC jobs whose clients all left (or died) are collected like the others: a trainer
    # that comes back later under the same job_name starts the epoch again.
    "gc_dynamic_sharding_jobs": True,
    "heartbeat_interval_ms": 5_000,
    "worker_poll_interval_ms": 2_000,
    "client_report_timeout_ms": 15_000,
    "max_tracked_clients": 1_000,
}


def setting(config: DispatcherServerConfig | WorkerServerConfig, name: str) -> Any:
    """A setting's value as the server runs it: the configured one, else ``DEFAULTS``."""
    value = getattr(config, name)
    return DEFAULTS[name] if value is None else value


@dataclass(frozen=True)
class DispatcherServerConfig:
    """What ``tfdata-server dispatcher`` needs: TensorFlow's DispatcherConfig plus the probes."""

    port: int
    health_port: int
    protocol: str = "grpc"
    work_dir: str | None = None
    fault_tolerant_mode: bool = False
    # Set for the static sharding policies only: the exact worker addresses, in index order.
    worker_addresses: tuple[str, ...] | None = None
    job_gc_check_interval_ms: int | None = None
    job_gc_timeout_ms: int | None = None
    client_timeout_ms: int | None = None
    worker_timeout_ms: int | None = None
    worker_max_concurrent_snapshots: int | None = None
    gc_dynamic_sharding_jobs: bool | None = None
    # The workers' health port: the dispatcher reads their /metrics there (tasks, CPU) for the
    # signals it serves. None: it does not ask them, and says that it cannot tell who reads.
    worker_health_port: int | None = None
    worker_poll_interval_ms: int | None = None
    # Forget a reporting client whose reports stop for this long.
    client_report_timeout_ms: int | None = None
    max_tracked_clients: int | None = None
    # The CPU this pod is given, in millicores (see WorkerServerConfig.cpu_given_millicores).
    cpu_given_millicores: int | None = None
    # Once started, delete the directories beside work_dir named like static journals: the
    # operator never sends a dispatcher back to one (see render.journal.static_journal).
    prune_old_journals: bool = False
    # Imported (modules) and loaded with tf.load_op_library (paths), in this order, in the
    # TensorFlow process before its server starts: ops the trainers' pipelines use.
    preload_modules: tuple[str, ...] = ()
    preload_op_libraries: tuple[str, ...] = ()
    # spec.snapshots.directory, as the pods see it (a volume is mounted at that path; a URL is the
    # same store everywhere): the only place /v1/snapshots deletes in or checks for writing
    # (wire.snapshots.confined). None: the service has no spec.snapshots, and neither is done.
    snapshot_dir: str | None = None
    # Set only when the user chose spec.dispatcher.workDir (one that other services may also be
    # given): this service, as ``<namespace>/<name>``, and its owner marker, OWNER_MARKER_NAME in
    # the journal base. The dispatcher claims the workDir there, and refuses one another service owns.
    owner: str | None = None
    owner_marker: str | None = None

    def validate(self) -> None:
        _check_port("port", self.port)
        _check_port("health_port", self.health_port)
        if self.port == self.health_port:
            raise ConfigError(f"port and health_port must differ (both are {self.port})")
        _check_owner(self)
        if self.snapshot_dir is not None and not SNAPSHOT_DIR.fullmatch(self.snapshot_dir):
            raise ConfigError(
                f"snapshot_dir must be an absolute path or a URL such as gs://bucket/path, got {self.snapshot_dir!r}"
            )
        if self.fault_tolerant_mode and not self.work_dir:
            raise ConfigError("fault_tolerant_mode needs work_dir: set work_dir to a journal location")
        if self.prune_old_journals and not (self.work_dir and STATIC_JOURNAL_NAME.fullmatch(_leaf(self.work_dir))):
            raise ConfigError(
                "prune_old_journals needs a work_dir whose last component is a static journal name "
                f"(<N>-workers-g<generation>), got {self.work_dir!r}"
            )
        if self.worker_health_port is not None:
            _check_port("worker_health_port", self.worker_health_port)
        if self.worker_addresses is not None:
            if not self.worker_addresses:
                raise ConfigError("worker_addresses, when set, must list at least one worker")
            if len(set(self.worker_addresses)) != len(self.worker_addresses):
                raise ConfigError(f"worker_addresses has duplicates: {list(self.worker_addresses)}")
        for name in (
            "job_gc_check_interval_ms",
            "job_gc_timeout_ms",
            "client_timeout_ms",
            "worker_timeout_ms",
            "worker_max_concurrent_snapshots",
        ):
            value = getattr(self, name)
            lowest = -1 if name == "job_gc_timeout_ms" else 0  # TensorFlow's -1: never collect jobs
            if value is not None and (not isinstance(value, int) or value < lowest):
                raise ConfigError(f"{name} must be an integer of at least {lowest}, got {value!r}")
        _check_positive(self, ("worker_poll_interval_ms", "client_report_timeout_ms", "max_tracked_clients"))
        _check_positive(self, ("cpu_given_millicores",))
        _check_preload(self)


@dataclass(frozen=True)
class WorkerServerConfig:
    """What ``tfdata-server worker`` needs: TensorFlow's WorkerConfig plus the probes.

    ``worker_address_format`` holds ``{pod_name}``, which the server replaces with its own
    pod name, so each worker announces its stable DNS name, never ``localhost``.
    """

    port: int
    health_port: int
    dispatcher_address: str
    worker_address_format: str
    protocol: str = "grpc"
    heartbeat_interval_ms: int | None = None
    dispatcher_timeout_ms: int | None = None
    data_transfer_protocol: str | None = None
    data_transfer_port: int | None = None
    # Like worker_address_format, and may also hold TensorFlow's own ``%dts_port%``.
    data_transfer_address_format: str | None = None
    # The CPU the pod is given, in millicores: its container's CPU limit if it has one, else
    # its request. CPU used over this is the saturation in /metrics; None: the cgroup's quota,
    # else the machine's CPUs.
    cpu_given_millicores: int | None = None
    # Imported (modules) and loaded with tf.load_op_library (paths), in this order, in the
    # TensorFlow process before its server starts: ops the trainers' pipelines use.
    preload_modules: tuple[str, ...] = ()
    preload_op_libraries: tuple[str, ...] = ()
    # TensorFlow's WorkerConfig.cross_trainer_cache_size_bytes: the most this worker keeps for each
    # job read through the cross-trainer cache. None: TensorFlow's default (10 GiB).
    cross_trainer_cache_size_bytes: int | None = None

    def validate(self) -> None:
        _check_port("port", self.port)
        _check_port("health_port", self.health_port)
        if self.port == self.health_port:
            raise ConfigError(f"port and health_port must differ (both are {self.port})")
        if not self.dispatcher_address or "://" in self.dispatcher_address:
            raise ConfigError(f"dispatcher_address must be host:port without a scheme, got {self.dispatcher_address!r}")
        if POD_NAME_PLACEHOLDER not in self.worker_address_format:
            raise ConfigError(
                f"worker_address_format must contain {POD_NAME_PLACEHOLDER}, got {self.worker_address_format!r}"
            )
        if self.data_transfer_port is not None:
            _check_port("data_transfer_port", self.data_transfer_port)
        positive = ("heartbeat_interval_ms", "dispatcher_timeout_ms", "cpu_given_millicores")
        _check_positive(self, (*positive, "cross_trainer_cache_size_bytes"))
        _check_preload(self)

    def worker_address(self, pod_name: str) -> str:
        return worker_address(self.worker_address_format, pod_name)

    def data_transfer_address(self, pod_name: str) -> str | None:
        if self.data_transfer_address_format is None:
            return None
        return worker_address(self.data_transfer_address_format, pod_name)


ServerConfig = DispatcherServerConfig | WorkerServerConfig
_KINDS: dict[str, type[DispatcherServerConfig] | type[WorkerServerConfig]] = {
    "dispatcher": DispatcherServerConfig,
    "worker": WorkerServerConfig,
}


def worker_address(address_format: str, pod_name: str) -> str:
    """The address a worker announces; the dispatcher's static list is built with this too."""
    return address_format.replace(POD_NAME_PLACEHOLDER, pod_name)


# Fields added after the first release are left out of the JSON at their default, so an
# operator upgrade does not restart pods whose configuration means the same.
_LEFT_OUT_AT_DEFAULT = ("prune_old_journals", "preload_modules", "preload_op_libraries")
_TUPLE_FIELDS = ("worker_addresses", "preload_modules", "preload_op_libraries")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DispatcherServerConfig)}


def to_json(config: ServerConfig) -> str:
    """Serialises a config deterministically (sorted keys), so equal configs give equal text."""
    kind = "dispatcher" if isinstance(config, DispatcherServerConfig) else "worker"
    body = {k: v for k, v in dataclasses.asdict(config).items() if v is not None}
    for name in _LEFT_OUT_AT_DEFAULT:
        if name in body and body[name] == _DEFAULTS[name]:
            del body[name]
    for name in _TUPLE_FIELDS:
        if name in body:
            body[name] = list(body[name])
    return json.dumps({"kind": kind, **body}, sort_keys=True, separators=(",", ":"))


def from_json(text: str, expected_kind: str) -> ServerConfig:
    """Parses and validates a config for ``expected_kind`` ("dispatcher" or "worker")."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"configuration is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError("configuration must be a JSON object")
    kind = raw.pop("kind", None)
    if kind != expected_kind:
        raise ConfigError(f"configuration is for a {kind!r}, but this server runs as a {expected_kind!r}")
    return _from_mapping(_KINDS[expected_kind], raw)


def _from_mapping(cls: type[DispatcherServerConfig] | type[WorkerServerConfig], raw: Mapping[str, Any]) -> ServerConfig:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"unknown configuration keys {unknown}; known keys are {sorted(known)}")
    _check_json_types(cls, raw)
    values = dict(raw)
    for name in _TUPLE_FIELDS:
        if isinstance(values.get(name), list):
            values[name] = tuple(values[name])
    try:
        config = cls(**values)
    except TypeError as exc:
        raise ConfigError(f"incomplete configuration: {exc}") from exc
    config.validate()
    return config


def _check_json_types(cls: type[DispatcherServerConfig] | type[WorkerServerConfig], raw: Mapping[str, Any]) -> None:
    """JSON types per field, so a wrong one is a ConfigError, not a crash or a silent coercion."""
    for name, hint in typing.get_type_hints(cls).items():
        if name not in raw:
            continue
        value = raw[name]
        options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        if value is None and type(None) in options:
            continue
        base = next(option for option in options if option is not type(None))
        if typing.get_origin(base) is tuple:  # tuple[str, ...] arrives as a JSON list
            ok, wanted = isinstance(value, list) and all(isinstance(v, str) for v in value), "a list of strings"
        elif base is int:
            ok, wanted = isinstance(value, int) and not isinstance(value, bool), "an integer"
        elif base is bool:
            ok, wanted = isinstance(value, bool), "true or false"
        else:
            ok, wanted = isinstance(value, base), "a string"
        if not ok:
            raise ConfigError(f"{name} must be {wanted}, got {value!r}")


def load(expected_kind: str, path: str | None = None, environ: Mapping[str, str] = os.environ) -> ServerConfig:
    """Reads the config from ``path`` if given, else from the ``TFDATA_SERVER_CONFIG`` variable."""
    if path:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise ConfigError(f"cannot read configuration file {path}: {exc.strerror}") from exc
    else:
        text = environ.get(CONFIG_ENV, "")
        if not text:
            raise ConfigError(f"no configuration: pass --config FILE or set {CONFIG_ENV}")
    return from_json(text, expected_kind)


def _check_positive(config: DispatcherServerConfig | WorkerServerConfig, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(config, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")


# A dotted Python module name, as ``import`` takes it.
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _check_preload(config: DispatcherServerConfig | WorkerServerConfig) -> None:
    for module in config.preload_modules:
        if not MODULE_NAME.fullmatch(module):
            raise ConfigError(f"preload_modules: {module!r} is not a Python module name (like tensorflow_text)")
    for path in config.preload_op_libraries:
        if not path.startswith("/"):
            raise ConfigError(f"preload_op_libraries: {path!r} must be an absolute path to a shared library")


def _check_owner(config: DispatcherServerConfig) -> None:
    if (config.owner is None) != (config.owner_marker is None):
        raise ConfigError("owner and owner_marker are set together or not at all")
    if config.owner is None or config.owner_marker is None:
        return
    if not OWNER.fullmatch(config.owner):
        raise ConfigError(f"owner must be <namespace>/<name> of a TFDataService, got {config.owner!r}")
    if not config.work_dir:
        raise ConfigError("owner_marker needs work_dir: the marker is in the journal's location")
    base = config.owner_marker.rsplit("/", 1)[0]
    work_dir = config.work_dir.rstrip("/")
    if _leaf(config.owner_marker) != OWNER_MARKER_NAME or base not in (work_dir, work_dir.rsplit("/", 1)[0]):
        raise ConfigError(
            f"owner_marker must be {OWNER_MARKER_NAME} in work_dir or in its parent, got {config.owner_marker!r}"
        )


def _check_port(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise ConfigError(f"{name} must be an integer port in 1..65535, got {value!r}")


__all__ = [
    "CONFIG_ENV",
    "DEFAULTS",
    "JOURNAL_DIR_NAME",
    "OWNER_MARKER_NAME",
    "POD_NAMESPACE_ENV",
    "POD_NAME_ENV",
    "ConfigError",
    "DispatcherServerConfig",
    "ServerConfig",
    "WorkerServerConfig",
    "from_json",
    "load",
    "setting",
    "to_json",
    "worker_address",
]


def _leaf(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]
