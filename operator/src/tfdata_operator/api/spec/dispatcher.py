"""``spec.dispatcher``: its ports, its journal (faultTolerantMode, workDir, storage) and its timeouts.

Its pod's settings are read by ``spec/pods.py``.
"""

from __future__ import annotations

import re

from tfdata_operator.api.quantity import canonical as canonical_quantity
from tfdata_operator.api.spec.pods import pod_settings, same_ports
from tfdata_operator.api.spec.reader import DNS_SUBDOMAIN, Reader
from tfdata_operator.api.spec.types import (
    MAX_MS,
    WORK_DIR_SCHEMES,
    DispatcherSpec,
    SnapshotsSpec,
    StorageSpec,
    operator_volumes,
)

_WORK_DIR = re.compile(r"^(/|(file|gs)://)\S*$")


def parse_dispatcher(r: Reader, snapshots: SnapshotsSpec | None = None, program: bool = False) -> DispatcherSpec:
    d = DispatcherSpec()
    port = r.integer("port", d.port, 1, 65535)
    health_port = r.integer("healthPort", d.health_port, 1, 65535)
    fault_tolerant = r.boolean("faultTolerantMode", d.fault_tolerant_mode)
    work_dir = r.string("workDir", None, max_length=1024)
    if work_dir is not None and not _WORK_DIR.match(work_dir):
        r.problems.append(
            f"spec.dispatcher.workDir must be an absolute path or a {' or '.join(WORK_DIR_SCHEMES)} URL "
            f"(the filesystems TensorFlow 2.21 has), got {work_dir!r}"
        )
        work_dir = None
    storage = _storage(r.child("storage"))
    ms = {
        key: r.integer(key, None, 1, MAX_MS) for key in ("jobGcCheckIntervalMs", "clientTimeoutMs", "workerTimeoutMs")
    }
    ms["jobGcTimeoutMs"] = r.integer("jobGcTimeoutMs", None, -1, MAX_MS)  # -1: never collect jobs
    if ms["jobGcTimeoutMs"] == 0:
        r.problems.append("spec.dispatcher.jobGcTimeoutMs must be -1 (keep jobs forever) or at least 1")
    concurrent_snapshots = r.integer("workerMaxConcurrentSnapshots", None, 0, 1000)
    gc_dynamic = r.boolean("gcDynamicShardingJobs", True) if r.has("gcDynamicShardingJobs") else None
    pod = pod_settings(r, operator_volumes(journal=storage.enabled, snapshots=snapshots, program=program), "dispatcher")
    r.finish()
    if port == health_port:
        r.problems.append(same_ports(r, port))
    if fault_tolerant and work_dir is None and not storage.enabled:
        default = "" if r.has("faultTolerantMode") else " (true by default)"
        r.problems.append(
            f"spec.dispatcher.faultTolerantMode{default} needs somewhere to journal, and "
            "spec.dispatcher.storage.enabled is false with no spec.dispatcher.workDir: set storage.enabled to "
            "true (its default), set a workDir, or set faultTolerantMode to false"
        )
    assert port is not None and health_port is not None
    return DispatcherSpec(
        port=port,
        health_port=health_port,
        fault_tolerant_mode=fault_tolerant,
        work_dir=work_dir,
        storage=storage,
        job_gc_check_interval_ms=ms["jobGcCheckIntervalMs"],
        job_gc_timeout_ms=ms["jobGcTimeoutMs"],
        client_timeout_ms=ms["clientTimeoutMs"],
        worker_timeout_ms=ms["workerTimeoutMs"],
        worker_max_concurrent_snapshots=concurrent_snapshots,
        gc_dynamic_sharding_jobs=gc_dynamic,
        pod=pod,
    )


def _storage(r: Reader) -> StorageSpec:
    d = StorageSpec()
    storage = StorageSpec(
        enabled=r.boolean("enabled", d.enabled),
        size=canonical_quantity(r.quantity("size", d.size)),
        storage_class_name=r.string("storageClassName", pattern=DNS_SUBDOMAIN),
        when_deleted=r.enum("whenDeleted", ("Retain", "Delete"), d.when_deleted) or d.when_deleted,
    )
    r.finish()
    return storage
