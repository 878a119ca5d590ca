"""A ``serverconfig`` model as TensorFlow's own ``DispatcherConfig`` / ``WorkerConfig`` protos, for
the TensorFlow process (``tfserver``). TensorFlow is imported when these are called; a setting an
older TensorFlow's protos lack is left out and logged."""

from __future__ import annotations

import functools
from typing import Any

from tfdata_operator.server import configure_logging
from tfdata_operator.wire import serverconfig
from tfdata_operator.wire.serverconfig import DispatcherServerConfig, WorkerServerConfig


def _time_or_placeholder(value: int | None) -> int:
    """Mirrors TensorFlow's namedtuple configs: unset is 0 ("runtime default"), 0 is 1 ms."""
    if value is None:
        return 0
    if value == 0:
        return 1
    return value


def dispatcher_config_proto(config: DispatcherServerConfig) -> Any:
    """TensorFlow's DispatcherConfig proto; the namedtuple cannot carry client_timeout_ms.

    Unset timings take ``serverconfig.DEFAULTS`` (chosen for a prompt "is any client
    reading?" signal), not TensorFlow's own.
    """
    from tensorflow.core.protobuf import service_config_pb2  # type: ignore[import-untyped]

    setting = functools.partial(serverconfig.setting, config)
    values: dict[str, Any] = {
        "port": config.port,
        "protocol": config.protocol,
        "fault_tolerant_mode": config.fault_tolerant_mode,
        "job_gc_check_interval_ms": _time_or_placeholder(setting("job_gc_check_interval_ms")),
        "job_gc_timeout_ms": _time_or_placeholder(setting("job_gc_timeout_ms")),
        "client_timeout_ms": setting("client_timeout_ms"),
        "gc_dynamic_sharding_jobs": setting("gc_dynamic_sharding_jobs"),
    }
    if config.work_dir is not None:
        values["work_dir"] = config.work_dir
    if config.worker_addresses is not None:
        values["worker_addresses"] = list(config.worker_addresses)
    # Passed as they are, like TensorFlow's DispatcherConfig does for worker_timeout_ms:
    # unset (0 in the proto) leaves them to the runtime.
    for name in ("worker_timeout_ms", "worker_max_concurrent_snapshots"):
        value = getattr(config, name)
        if value is not None:
            values[name] = value
    return _config_proto(service_config_pb2.DispatcherConfig, values)


def worker_config_proto(config: WorkerServerConfig, pod_name: str) -> Any:
    """TensorFlow's WorkerConfig proto, announcing this pod's address (never localhost)."""
    from tensorflow.core.protobuf import service_config_pb2

    values: dict[str, Any] = {
        "port": config.port,
        "protocol": config.protocol,
        "dispatcher_address": config.dispatcher_address,
        "worker_address": config.worker_address(pod_name),
        "heartbeat_interval_ms": serverconfig.setting(config, "heartbeat_interval_ms"),
        "dispatcher_timeout_ms": _time_or_placeholder(config.dispatcher_timeout_ms),
    }
    if config.data_transfer_protocol is not None:
        values["data_transfer_protocol"] = config.data_transfer_protocol
    if config.data_transfer_port is not None:
        values["data_transfer_port"] = config.data_transfer_port  # TensorFlow 2.17 and newer
    transfer_address = config.data_transfer_address(pod_name)
    if transfer_address is not None:
        values["data_transfer_address"] = transfer_address
    if config.cross_trainer_cache_size_bytes is not None:
        # Only in the proto: TensorFlow's WorkerConfig namedtuple (2.16 to 2.21) has no such field.
        values["cross_trainer_cache_size_bytes"] = config.cross_trainer_cache_size_bytes
    return _config_proto(service_config_pb2.WorkerConfig, values)


def _config_proto(proto_class: Any, values: dict[str, Any]) -> Any:
    """``proto_class(**values)`` without the fields this TensorFlow's proto lacks (one older
    than the pinned): each one left out is logged, since the server runs without it."""
    known = proto_class.DESCRIPTOR.fields_by_name
    unused = sorted(name for name in values if name not in known)
    if unused:
        import tensorflow as tf

        configure_logging().warning(
            "TensorFlow %s has no %s field %s: unused (newer TensorFlows have it)",
            tf.__version__,
            proto_class.DESCRIPTOR.name,
            ", ".join(unused),
        )
    return proto_class(**{name: value for name, value in values.items() if name in known})
