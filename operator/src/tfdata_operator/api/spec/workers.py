"""``spec.workers``: replicas, ports and timeouts, how a rescale or a drain waits, and the cross-trainer cache.

The cross-trainer cache is refused when it cannot fit in a worker's memory. Its pods' settings
are read by ``spec/pods.py``; the count under ``spec.autoscaling``, by ``spec/autoscaling.py``.
"""

from __future__ import annotations

from tfdata_operator.api.quantity import canonical as canonical_quantity
from tfdata_operator.api.quantity import quantity_bytes
from tfdata_operator.api.spec.pods import pod_settings, same_ports
from tfdata_operator.api.spec.reader import Reader
from tfdata_operator.api.spec.types import (
    CACHE_MEMORY_MARGIN,
    MAX_CROSS_TRAINER_CACHE,
    MAX_MS,
    MIN_CROSS_TRAINER_CACHE,
    RESCALE_IMMEDIATE,
    RESCALE_POLICIES,
    RESCALE_WHEN_IDLE,
    TRANSFER_PROTOCOLS,
    PodSettings,
    SnapshotsSpec,
    WorkersSpec,
    operator_volumes,
)


def parse_workers(r: Reader, snapshots: SnapshotsSpec | None = None, program: bool = False) -> WorkersSpec:
    d = WorkersSpec()
    # 0 only for a service scaled to zero (spec.autoscaling.minReplicas 0; parse checks).
    replicas = r.integer("replicas", d.replicas, 0, 1000)
    port = r.integer("port", d.port, 1, 65535)
    health_port = r.integer("healthPort", d.health_port, 1, 65535)
    heartbeat = r.integer("heartbeatIntervalMs", None, 1, 3_600_000)
    dispatcher_timeout = r.integer("dispatcherTimeoutMs", None, 1, MAX_MS)
    protocol = r.enum("dataTransferProtocol", TRANSFER_PROTOCOLS, None)
    transfer_port = r.integer("dataTransferPort", None, 1, 65535)
    rescale_policy = r.enum("rescalePolicy", RESCALE_POLICIES, RESCALE_WHEN_IDLE)
    max_wait = r.integer("rescaleMaxWaitSeconds", None, 1, 604_800)
    unreadable_wait = r.integer("drainUnreadableMaxWaitSeconds", d.drain_unreadable_max_wait_seconds, 60, 604_800)
    pod = pod_settings(r, operator_volumes(journal=False, snapshots=snapshots, program=program), "worker")
    cache = _cross_trainer_cache(r, pod)
    r.finish()
    if port == health_port:
        r.problems.append(same_ports(r, port))
    if transfer_port is not None and transfer_port in (port, health_port):
        r.problems.append("spec.workers.dataTransferPort must differ from spec.workers.port and healthPort")
    if transfer_port is not None:
        # No protocol runs a server of its own on the port (TRANSFER_PROTOCOLS), so "set a protocol"
        # would not help: none of TensorFlow 2.21's uses it.
        used = f" with dataTransferProtocol {protocol}" if protocol else ""
        r.problems.append(
            f"spec.workers.dataTransferPort is not used{used}: TensorFlow 2.21 "
            "sends elements over the workers' gRPC port (spec.workers.port); remove dataTransferPort"
        )
    if max_wait is not None and rescale_policy == RESCALE_IMMEDIATE:
        r.problems.append(
            "spec.workers.rescaleMaxWaitSeconds applies only with rescalePolicy WhenIdle: an Immediate change "
            "never waits. Remove rescaleMaxWaitSeconds or the rescalePolicy"
        )
    assert replicas is not None and port is not None and health_port is not None and rescale_policy is not None
    assert unreadable_wait is not None
    return WorkersSpec(
        replicas=replicas,
        port=port,
        health_port=health_port,
        heartbeat_interval_ms=heartbeat,
        dispatcher_timeout_ms=dispatcher_timeout,
        data_transfer_protocol=protocol,
        data_transfer_port=transfer_port,
        rescale_policy=rescale_policy,
        rescale_max_wait_seconds=max_wait,
        drain_unreadable_max_wait_seconds=unreadable_wait,
        cross_trainer_cache_size_bytes=cache,
        pod=pod,
    )


def _cross_trainer_cache(r: Reader, pod: PodSettings) -> int | None:
    """spec.workers.crossTrainerCacheSize in bytes, refused when it cannot fit in a worker's memory."""
    key = "crossTrainerCacheSize"
    if not r.has(key):
        return None
    value = r.quantity(key, "")
    if not value:
        return None  # refused by quantity() already
    size = quantity_bytes(value)
    low, high = quantity_bytes(MIN_CROSS_TRAINER_CACHE), quantity_bytes(MAX_CROSS_TRAINER_CACHE)
    if not low <= size <= high:
        r.fail(
            key,
            f"must be between {MIN_CROSS_TRAINER_CACHE} and {MAX_CROSS_TRAINER_CACHE}, got {value}: it is the most "
            "each worker keeps in memory for each job read through the cross-trainer cache",
        )
        return None
    where, written, memory = _memory_bound(pod)
    margin = quantity_bytes(CACHE_MEMORY_MARGIN)
    if memory is None:
        r.fail(
            key,
            f"({value}) needs a memory limit for the workers, to check that the cache fits: each worker keeps up "
            f"to {value} in memory for each job read through the cross-trainer cache, beside the {CACHE_MEMORY_MARGIN} "
            f"a TensorFlow worker holds itself. Set {r.path}.resources.limits.memory to at least "
            f"{_bytes_text(size + margin)} (or requests.memory)",
        )
        return None
    if size + margin > memory:
        r.fail(
            key,
            f"({value}) does not fit in the workers' memory: {r.path}.resources.{where}.memory is "
            f"{written}, and a worker needs the cache plus about {CACHE_MEMORY_MARGIN} for TensorFlow "
            f"itself. Set crossTrainerCacheSize to at most {_bytes_text(memory - margin, up=False)}, or "
            f"{r.path}.resources.{where}.memory to at least {_bytes_text(size + margin)}",
        )
        return None
    return size


def _memory_bound(pod: PodSettings) -> tuple[str, str, int | None]:
    """The memory a worker container may count on: its limit, else its request, as written and in bytes
    (None: neither set)."""
    for where in ("limits", "requests"):
        amount = pod.resources.get(where, {}).get("memory")
        if amount is not None:
            return where, str(amount), quantity_bytes(amount)
    return "limits", "", None


def _bytes_text(size: int, up: bool = True) -> str:
    """``size`` as the quantity people write, ``1536Mi``, ``2Gi``: a whole Mi, rounded up for a least
    (so that it is enough), down for a most (so that it fits)."""
    mi = -(-size // 2**20) if up else size // 2**20
    return canonical_quantity(f"{mi}Mi")
