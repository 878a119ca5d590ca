"""The server configuration written into the dispatcher's and the workers' pods.

The spec in, ``wire.serverconfig``'s typed model out (the one ``tfdata-server`` reads), and
back: the configuration a live StatefulSet holds, and the hash that rolls its pods on a change.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tfdata_operator.api.spec import PodSettings, ServiceSpec, default_requests, parse_quantity
from tfdata_operator.render.journal import journal_base, static_journal
from tfdata_operator.render.names import (
    DISPATCHER,
    WORKER,
    dispatcher_host,
    worker_address_format,
    worker_addresses,
)
from tfdata_operator.render.settings import BuildSettings, Manifest
from tfdata_operator.wire import serverconfig


def dispatcher_config(
    svc: ServiceSpec, settings: BuildSettings, worker_count: int, journal: str | None = None
) -> serverconfig.DispatcherServerConfig:
    """The dispatcher's configuration; ``worker_count`` sizes the static worker list.

    ``journal`` is a static dispatcher's journal subdirectory (see ``journal.static_journal``);
    by default the one a new service starts with.
    """
    d = svc.dispatcher
    work_dir = journal_base(svc)
    static_journal_dir = work_dir is not None and svc.is_static
    if work_dir is not None and svc.is_static:
        work_dir = f"{work_dir.rstrip('/')}/{journal or static_journal(svc, settings, worker_count, None)}"
    # A user's workDir may be given to other services too (the journal volume is this service's
    # own): the dispatcher claims it with a marker, and refuses one another service claimed.
    owner_marker = f"{d.work_dir.rstrip('/')}/{serverconfig.OWNER_MARKER_NAME}" if d.work_dir else None
    return serverconfig.DispatcherServerConfig(
        port=d.port,
        health_port=d.health_port,
        work_dir=work_dir,
        fault_tolerant_mode=d.fault_tolerant_mode,
        worker_addresses=tuple(worker_addresses(svc, settings, worker_count)) if svc.is_static else None,
        job_gc_check_interval_ms=d.job_gc_check_interval_ms,
        job_gc_timeout_ms=d.job_gc_timeout_ms,
        client_timeout_ms=d.client_timeout_ms,
        worker_timeout_ms=d.worker_timeout_ms,
        worker_max_concurrent_snapshots=d.worker_max_concurrent_snapshots,
        gc_dynamic_sharding_jobs=d.gc_dynamic_sharding_jobs,
        prune_old_journals=static_journal_dir,
        worker_health_port=svc.workers.health_port,
        cpu_given_millicores=cpu_given_millicores(d.pod, DISPATCHER),
        preload_modules=svc.preload.modules,
        preload_op_libraries=svc.preload.op_libraries,
        # As the pods see it: a volume is mounted at that path (operator_volumes), a URL is the same
        # store in every pod; the operator and the trainers' helper join names to it as written.
        snapshot_dir=svc.snapshots.directory if svc.snapshots else None,
        owner=f"{svc.namespace}/{svc.name}" if owner_marker else None,
        owner_marker=owner_marker,
    )


# A static dispatcher is ready once every listed worker has registered, and workers that kept
# running through its restart re-register on their next heartbeat: the heartbeat bounds every
# static rescale. At 1 s it costs the dispatcher ~16 millicores with 16 workers (docs/sharding.md,
# benchmarks/bench_heartbeat.py), against ~4 at the server program's 5 s default.
STATIC_HEARTBEAT_MS = 1_000


def worker_config(svc: ServiceSpec, settings: BuildSettings) -> serverconfig.WorkerServerConfig:
    w = svc.workers
    transfer_format = None
    if w.data_transfer_protocol is not None:
        # TensorFlow fills in %dts_port% with the data transfer server's port.
        transfer_format = worker_address_format(svc, settings, "%dts_port%")
    return serverconfig.WorkerServerConfig(
        port=w.port,
        health_port=w.health_port,
        dispatcher_address=f"{dispatcher_host(svc, settings)}:{svc.dispatcher.port}",
        worker_address_format=worker_address_format(svc, settings, w.port),
        heartbeat_interval_ms=w.heartbeat_interval_ms or (STATIC_HEARTBEAT_MS if svc.is_static else None),
        dispatcher_timeout_ms=w.dispatcher_timeout_ms,
        data_transfer_protocol=w.data_transfer_protocol,
        data_transfer_port=w.data_transfer_port,
        data_transfer_address_format=transfer_format,
        cpu_given_millicores=cpu_given_millicores(w.pod, WORKER),
        preload_modules=svc.preload.modules,
        preload_op_libraries=svc.preload.op_libraries,
        cross_trainer_cache_size_bytes=w.cross_trainer_cache_size_bytes,
    )


def cpu_given_millicores(pod: PodSettings, component: str) -> int | None:
    """The CPU a server's /metrics divides by: its limit, the most it can use, else its request
    (the default request where the user set neither, as the container gets it).

    Without either the server falls back to its cgroup's quota or the machine's CPUs.
    """
    resources = default_requests(pod, component)
    for kind in ("limits", "requests"):
        cpu = resources.get(kind, {}).get("cpu")
        if cpu is not None:
            return max(1, round(parse_quantity(cpu) * 1000))
    return None


def config_hash(config_json: str) -> str:
    return hashlib.sha256(config_json.encode()).hexdigest()[:16]


def read_config(statefulset: Manifest | None) -> dict[str, Any] | None:
    """The server configuration inside a (live) StatefulSet, or None if it has none."""
    if not statefulset:
        return None
    containers = statefulset.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []
    for container in containers:
        for env in container.get("env") or []:
            if env.get("name") == serverconfig.CONFIG_ENV and env.get("value"):
                try:
                    parsed = json.loads(env["value"])
                except json.JSONDecodeError:
                    return None
                return parsed if isinstance(parsed, dict) else None
    return None
