"""The dispatcher's journal: where it is written (spec.dispatcher.workDir and storage), which
subdirectory a static dispatcher uses, and the claim that holds it (volumeClaimTemplates).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfdata_operator.api.spec import DEFAULT_WORK_DIR, JOURNAL_MOUNT, JOURNAL_VOLUME, ServiceSpec
from tfdata_operator.render.names import DISPATCHER, labels, worker_addresses
from tfdata_operator.render.settings import BuildSettings, Manifest
from tfdata_operator.wire import serverconfig

__all__ = ["DEFAULT_WORK_DIR", "add_journal_claim", "journal_base", "journal_mounts", "static_journal"]


def journal_base(svc: ServiceSpec) -> str | None:
    """Where the dispatcher journals (``DispatcherSpec.journal_base``)."""
    return svc.dispatcher.journal_base


def static_journal(
    svc: ServiceSpec, settings: BuildSettings, worker_count: int, live_config: Mapping[str, Any] | None
) -> str:
    """The journal subdirectory of a static dispatcher with ``worker_count`` workers.

    The running dispatcher's journal is kept while its worker list stays the same (a restart
    replays it). A changed list gets a journal of its own, named after the generation that
    changed it, and never an older one: TensorFlow's journal keeps every worker that ever
    registered (a shorter list would then fail every new job), and a replayed older journal
    would count workers as registered before they heartbeat and hand out task ids those
    long-running workers already used under the newer one, which they answer with end of
    sequence (the client silently misses their shards).
    """
    base = (journal_base(svc) or "").rstrip("/")
    live = live_config or {}
    live_dir = live.get("work_dir")
    if live.get("worker_addresses") == worker_addresses(svc, settings, worker_count) and isinstance(live_dir, str):
        leaf = live_dir[len(base) + 1 :] if live_dir.startswith(base + "/") else ""
        if serverconfig.STATIC_JOURNAL_NAME.fullmatch(leaf):
            return leaf
    return f"{worker_count}-workers-g{svc.generation}"


def journal_mounts(svc: ServiceSpec) -> list[dict[str, Any]]:
    """The dispatcher container's mount of its journal claim, if it has one."""
    return [{"name": JOURNAL_VOLUME, "mountPath": JOURNAL_MOUNT}] if svc.dispatcher.storage.enabled else []


def add_journal_claim(svc: ServiceSpec, statefulset_spec: Manifest) -> None:
    """With spec.dispatcher.storage: the journal's claim, from the StatefulSet's volumeClaimTemplates."""
    storage = svc.dispatcher.storage
    if not storage.enabled:
        return
    claim_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": storage.size}},
    }
    if storage.storage_class_name:
        claim_spec["storageClassName"] = storage.storage_class_name
    statefulset_spec["volumeClaimTemplates"] = [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": JOURNAL_VOLUME, "labels": labels(svc, DISPATCHER)},
            "spec": claim_spec,
        }
    ]
    statefulset_spec["persistentVolumeClaimRetentionPolicy"] = {
        "whenDeleted": storage.when_deleted,
        "whenScaled": "Retain",
    }
