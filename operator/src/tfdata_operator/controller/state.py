"""The operator's shared state: one typed memo instead of attributes set on ``kopf.Memo``.

kopf hands the memo passed to ``kopf.operator(memo=...)`` to the operator's startup and
cleanup handlers, and a shallow copy of it to the handlers of each watched object (kopf
``docs/memos.rst``). Every field here holds an object that all those copies share; nothing
assigns a field after startup.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tfdata_operator.controller import cache, election
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.kube import Kube
from tfdata_operator.controller.readers import Readers, SnapshotReaders
from tfdata_operator.controller.workqueue import WorkQueue
from tfdata_operator.plan import snapshotdir


# Slots: kopf keeps a shallow copy of the memo for every object it has seen (kopf's
# ResourceMemory), about 16,000 of them at 1,220 services; a copy with slots is 6 times smaller.
@dataclass(slots=True)
class OperatorState:
    config: OperatorConfig
    # The writes whose results the watches have not delivered yet.
    overlay: cache.Overlay = field(default_factory=cache.Overlay)
    # How the services' pods are read (with the TFData autoscaler's readings), and what is kept of it.
    readers: Readers = field(default_factory=Readers)
    # Set once kopf has filled every index (its event handlers run only then).
    indexed: asyncio.Event = field(default_factory=asyncio.Event)
    # Set once this process may write: at once without leader election, else when it takes the Lease.
    leading: asyncio.Event = field(default_factory=asyncio.Event)
    # The rest is made by the startup handler, on kopf's event loop.
    indices: dict[str, Any] = field(init=False)
    queue: WorkQueue = field(init=False)
    # TFDataSnapshots: their queue (keys (namespace, name)) and its threads, and each one's body as last watched.
    snapshot_queue: WorkQueue = field(init=False)
    snapshot_pool: ThreadPoolExecutor = field(init=False)
    snapshot_bodies: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # The uids of TFDataSnapshots whose finalizer this process removed (they are gone, or going).
    snapshots_released: set[str] = field(default_factory=set)
    snapshot_readers: SnapshotReaders = field(default_factory=SnapshotReaders)
    # Each TFDataService's snapshot directory as last watched: who to requeue when it moves or goes.
    directories: dict[tuple[str, str], snapshotdir.DirectoryClaim] = field(default_factory=dict)
    # With --kueue: each service's Kueue Workloads as last watched, packed as the indexes' bodies are.
    workloads: dict[tuple[str, str], dict[tuple[str, str], cache.Packed]] = field(default_factory=dict)
    pool: ThreadPoolExecutor = field(init=False)
    tasks: list[asyncio.Task[None]] = field(init=False)
    kube: Kube = field(init=False)
    elector: election.Elector | None = None
