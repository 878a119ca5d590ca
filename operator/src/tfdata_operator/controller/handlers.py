"""The kopf wiring: watches feed the cache and the work queue; the queue's workers reconcile.

For every kind in ``children.OBSERVED`` and for TFDataServices, a kopf index keeps a trimmed
body of each object (kopf lists every indexed kind before any other handler runs, so no
reconcile ever sees a half-filled cache), and an event handler queues the service the object
belongs to. The periodic resync queues every known service from the cache: it reads nothing.
kopf writes nothing to the resources (no progress or diff-base annotations, no finalizers):
the operator only watches with kopf and writes through ``kube.Kube``.

With leader election (``election``), a standby runs all of this but the queue: its watches keep
the cache warm, and it reconciles and writes nothing until it takes the Lease; then it queues
every service it knows. Every request of the reconcile loop checks first that it still leads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from tfdata_operator.api import snapshot as snapshotapi
from tfdata_operator.api.identity import API_GROUP, INSTANCE_LABEL, MANAGED_SELECTOR, PLURAL, SNAPSHOT_PLURAL, VERSION
from tfdata_operator.controller import cache, election, kube, metrics, reconcile, snapshots
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.interface import Observed
from tfdata_operator.controller.kube import Kube, load_client_config
from tfdata_operator.controller.state import OperatorState
from tfdata_operator.controller.workqueue import WorkQueue
from tfdata_operator.plan import children, snapshotdir
from tfdata_operator.render import builders

SERVICES_INDEX = "tfdataservices_by_name"
# Each TFDataService's spec.snapshots.directory (plan.snapshotdir): only services that have one.
DIRECTORIES_INDEX = "tfdataservices_by_snapshot_directory"
Manifest = dict[str, Any]
# TFDataSnapshots reconciled at once (one is never reconciled twice at once).
SNAPSHOT_WORKERS = 4
_CONFIGMAPS = next(kind for kind in children.CHILDREN if kind.kind == "ConfigMap")
log = logging.getLogger(__name__)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: OperatorState, **indices: Any) -> None:
    # The operator records its own events; kopf's would be one per handler run.
    settings.posting.level = logging.WARNING
    # Restart watches regularly, so a silently broken connection is noticed.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # Watch only what the operator manages, filtered by the API server.
    for kind in (*children.OBSERVED, children.WORKLOAD):
        settings.watching.label_selectors[kind.group, kind.version, kind.plural] = MANAGED_SELECTOR
    config = memo.config
    api = load_client_config()
    memo.indices = indices
    memo.queue = queue = WorkQueue()
    memo.pool = ThreadPoolExecutor(max_workers=config.concurrent_reconciles, thread_name_prefix="reconcile")
    memo.tasks = [
        asyncio.create_task(queue.drain(lambda key: _reconcile(memo, key))) for _ in range(config.concurrent_reconciles)
    ]
    memo.tasks.append(asyncio.create_task(_resync_forever(memo)))
    start_snapshot_workers(memo)
    if config.election is None:
        memo.kube = Kube(api)
        _start_leading(memo)
        return
    leases = election.KubeLeases(Kube(api, counted=False), config.election.namespace, config.election.name)
    memo.elector = elector = election.Elector(leases, config.election)
    memo.kube = Kube(api, guard=elector.writing)
    metrics.LEADER.set(0)
    loop = asyncio.get_running_loop()
    elector.start(lambda: loop.call_soon_threadsafe(_start_leading, memo), election.exit_lost(elector.where))


def start_snapshot_workers(memo: OperatorState) -> None:
    """The TFDataSnapshots' queue, its workers and their threads (their own, not the services'): a
    deletion waits on its dispatcher for as long as the store takes (``probes.DELETION_TIMEOUT_SECONDS``),
    and holds only its worker, not every snapshot, nor a service's reconcile."""
    memo.snapshot_pool = ThreadPoolExecutor(max_workers=SNAPSHOT_WORKERS, thread_name_prefix="snapshot")
    memo.snapshot_queue = queue = WorkQueue()
    memo.tasks.extend(
        asyncio.create_task(queue.drain(lambda key: _reconcile_snapshot(memo, key))) for _ in range(SNAPSHOT_WORKERS)
    )


def _start_leading(memo: OperatorState) -> None:
    """From now on this process reconciles: every service the cache knows is queued (a standby queued nothing)."""
    memo.leading.set()
    metrics.LEADER.set(1)
    for key in list(memo.indices[SERVICES_INDEX]):
        memo.queue.add(key)
    for key in list(memo.snapshot_bodies):
        memo.snapshot_queue.add(key)


def _trigger(memo: OperatorState, key: cache.InstanceKey) -> None:
    if memo.leading.is_set():
        memo.queue.add(key)


@kopf.on.cleanup()
async def stop(memo: OperatorState, **_: Any) -> None:
    for task in memo.tasks:
        task.cancel()
    memo.pool.shutdown(wait=False, cancel_futures=True)
    memo.snapshot_pool.shutdown(wait=False, cancel_futures=True)
    if memo.elector is not None:
        # New writes are refused at once; those in flight may finish before the Lease is handed on.
        await asyncio.get_running_loop().run_in_executor(None, memo.elector.stop, 10.0)


# --- Watches: the cache and the triggers -------------------------------------------------


@kopf.index(API_GROUP, VERSION, PLURAL, id=SERVICES_INDEX)
async def index_service(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> dict[Any, Any]:
    return {(namespace or "", name): cache.pack(cache.trim(body))}


@kopf.index(API_GROUP, VERSION, PLURAL, id=DIRECTORIES_INDEX)
async def index_snapshot_directory(
    body: kopf.Body, namespace: str | None, name: str, **_: Any
) -> dict[Any, Any] | None:
    claim = snapshotdir.claim_of(body)
    # Keyed by its root: a reconcile compares its directory only with those under the same one.
    return {snapshotdir.root(claim.directory): claim} if claim is not None else None


@kopf.on.event(API_GROUP, VERSION, PLURAL)
async def service_event(
    event: kopf.RawEvent, body: kopf.Body, namespace: str | None, name: str, memo: OperatorState, **_: Any
) -> None:
    memo.indexed.set()  # kopf runs event handlers only once every index is filled
    key = (namespace or "", name)
    _trigger(memo, key)
    claim = None if event.get("type") == "DELETED" else snapshotdir.claim_of(body)
    before = memo.directories.pop(key, None)
    if claim is not None:
        memo.directories[key] = claim
    if before != claim:
        # A directory let go, or newly taken: the services it was or is nested with decide again.
        for other in _nested(memo, key, [c.directory for c in (before, claim) if c is not None]):
            _trigger(memo, other)


@kopf.on.event(API_GROUP, VERSION, SNAPSHOT_PLURAL)
async def snapshot_event(
    event: kopf.RawEvent, body: kopf.Body, namespace: str | None, name: str, memo: OperatorState, **_: Any
) -> None:
    """Each TFDataSnapshot's last body is kept outside kopf's indexes (an index of a kind whose CRD
    is not installed would hold up every reconcile), trimmed as the services' children are
    (``cache.trim_snapshot``): a tenant's annotations are not the operator's memory to grow."""
    key = (namespace or "", name)
    uid = body.get("metadata", {}).get("uid")
    if event.get("type") == "DELETED":
        memo.snapshot_bodies.pop(key, None)
        memo.snapshots_released.discard(uid)
        _queue_rivals(memo, key, body)
        return
    if uid in memo.snapshots_released:
        return  # its finalizer is gone, the object with it: an event from before that says otherwise
    memo.snapshot_bodies[key] = cache.trim_snapshot(body)
    if memo.leading.is_set():
        memo.snapshot_queue.add(key)


def _rivals(memo: OperatorState, key: cache.InstanceKey, body: Mapping[str, Any]) -> dict[cache.InstanceKey, Manifest]:
    """The other TFDataSnapshots of the namespace with the same snapshot name, as last watched: only
    those can name the same path (a snapshot name has no "/")."""
    named = snapshotapi.snapshot_name(body)
    return {
        other: other_body
        for other, other_body in memo.snapshot_bodies.items()
        if other[0] == key[0] and other != key and snapshotapi.snapshot_name(other_body) == named
    }


def _queue_rivals(memo: OperatorState, key: cache.InstanceKey, body: Mapping[str, Any]) -> None:
    """A TFDataSnapshot that is gone leaves its path: the one refused for it (PathTaken) takes it now."""
    if memo.leading.is_set():
        for other in _rivals(memo, key, body):
            memo.snapshot_queue.add(other)


def _watch(kind: children.Kind) -> None:
    trim = cache.trim_pod if kind is children.POD else cache.trim
    selector = {INSTANCE_LABEL: kopf.PRESENT}

    async def index_child(body: kopf.Body, **_: Any) -> dict[Any, Any] | None:
        full = {**body, "apiVersion": kind.api_version, "kind": kind.kind}
        key = cache.instance_of(full)
        return {key: cache.pack(trim(full))} if key else None

    async def child_event(body: kopf.Body, memo: OperatorState, **_: Any) -> None:
        memo.indexed.set()
        if key := cache.instance_of(body):
            _trigger(memo, key)

    kopf.index(kind.group, kind.version, kind.plural, id=kind.index, labels=selector)(index_child)
    kopf.on.event(kind.group, kind.version, kind.plural, id=f"{kind.plural}_event", labels=selector)(child_event)


for _kind in children.OBSERVED:
    _watch(_kind)


def watch_workloads() -> None:
    """With --kueue: the Kueue Workloads the operator wrote, each kept by its service (outside kopf's
    indexes, as the TFDataSnapshots are: an index of a kind whose CRD is not installed would hold up
    every reconcile), and its service queued on each change (``controller/kueue.py``)."""
    kind = children.WORKLOAD

    async def workload_event(event: kopf.RawEvent, body: kopf.Body, memo: OperatorState, **_: Any) -> None:
        full = {**body, "apiVersion": kind.api_version, "kind": kind.kind}
        key = cache.instance_of(full)
        if key is None:
            return
        name = full["metadata"]["name"]
        if event.get("type") == "DELETED":
            kept = memo.workloads.get(key, {})
            kept.pop((kind.kind, name), None)
            if not kept:
                memo.workloads.pop(key, None)
        else:
            memo.workloads.setdefault(key, {})[(kind.kind, name)] = cache.pack(cache.trim(full))
        _trigger(memo, key)

    selector = {INSTANCE_LABEL: kopf.PRESENT}
    kopf.on.event(kind.group, kind.version, kind.plural, id=f"{kind.plural}_event", labels=selector)(workload_event)


async def _resync_forever(memo: OperatorState) -> None:
    """Queues every TFDataService periodically, whether or not anything signalled a change, and counts
    them by their Ready condition for the metrics.

    A plain task rather than a kopf timer: kopf puts a finalizer on every object with a
    timer, and a TFDataService must stay deletable while the operator is not running.
    """
    config = memo.config
    await memo.indexed.wait()
    await memo.leading.wait()
    while True:
        await asyncio.sleep(config.resync_seconds)
        services = memo.indices[SERVICES_INDEX]
        metrics.count_services(packed.unpack() for key in list(services) for packed in services.get(key, ()))
        for key in list(services):
            memo.queue.add(key)


# --- The queue's worker ------------------------------------------------------------------


def snapshot(memo: OperatorState, key: cache.InstanceKey) -> tuple[dict[str, Any] | None, Observed]:
    """The service's body and objects as the cache has them (on the event loop: kopf updates the indexes there)."""
    indices = memo.indices
    objects: dict[cache.ObjectKey, dict[str, Any]] = {}
    for kind in children.CHILDREN:
        objects.update(cache.by_key(indices[kind.index].get(key, ())))
    pods = cache.by_key(indices[children.POD.index].get(key, ()))
    service = cache.by_key(indices[SERVICES_INDEX].get(key, ()))
    workloads = {k: packed.unpack() for k, packed in memo.workloads.get(key, {}).items()}
    merged = memo.overlay.merge(key, {**objects, **pods, **service, **workloads})
    body = merged.get((children.TFDATASERVICE.kind, key[1]))
    pod_list = [v for (kind, _), v in merged.items() if kind == "Pod"]
    kinds = {k.kind for k in children.CHILDREN}
    queued = tuple(v for (kind, _), v in merged.items() if kind == children.WORKLOAD.kind)
    return body, Observed({k: v for k, v in merged.items() if k[0] in kinds}, pod_list, workloads=queued)


def _nested(
    memo: OperatorState, key: cache.InstanceKey, directories: list[str]
) -> dict[cache.InstanceKey, snapshotdir.DirectoryClaim]:
    """The other services whose snapshot directory is one of ``directories``, or nested with one: looked
    for only under the same root (a bucket, a path's first name), not among every service."""
    index = memo.indices[DIRECTORIES_INDEX]
    found = {}
    for directory in directories:
        scheme, first = snapshotdir.root(directory)
        roots = [(scheme, first), (scheme, "")] if first else [r for r in list(index) if r[0] == scheme]
        for claim in (c for r in roots for c in index.get(r, ())):
            if (claim.namespace, claim.name) != key and snapshotdir.relation(claim.directory, directory):
                found[claim.namespace, claim.name] = claim
    return found


def directory_claims(
    memo: OperatorState, key: cache.InstanceKey, body: Manifest | None
) -> tuple[snapshotdir.DirectoryClaim, ...]:
    """The other services' snapshot directories that may be this one's, each with the directory its
    children publish, from the cache alone (nothing when this service has none)."""
    mine = snapshotdir.claim_of(body) if body is not None else None
    if mine is None:
        return ()
    found = []
    for other, claim in _nested(memo, key, [mine.directory]).items():
        if snapshotdir.shares(mine, claim):
            client = cache.by_key(memo.indices[_CONFIGMAPS.index].get(other, ()))
            published = snapshotdir.published(client.get(("ConfigMap", builders.client_configmap_name(other[1]))))
            found.append(dataclasses.replace(claim, published=published))
    return tuple(found)


def _service_body(memo: OperatorState, key: cache.InstanceKey) -> Manifest | None:
    """A TFDataService's body as the cache has it, without its children."""
    return cache.by_key(memo.indices[SERVICES_INDEX].get(key, ())).get((children.TFDATASERVICE.kind, key[1]))


async def _reconcile(memo: OperatorState, key: Any) -> bool:
    await memo.indexed.wait()
    body, observed = snapshot(memo, key)
    observed = dataclasses.replace(observed, directories=directory_claims(memo, key, body))
    if body is None:
        memo.overlay.forget(key)  # deleted: the garbage collector removes the children
        memo.readers.windows.forget(key)
        metrics.forget_service(*key)
        return True
    started = time.monotonic()
    try:
        loop = asyncio.get_running_loop()
        outcome = await loop.run_in_executor(
            memo.pool, reconcile.reconcile, memo.kube, memo.config, body, observed, memo.readers
        )
    except Exception as exc:  # retried with backoff; one line, not a traceback per attempt
        if kube.namespace_terminating(exc):
            # Not a failure: the namespace's deletion removes the service too, and its watch event ends it.
            log.info("Namespace %s is being deleted: nothing more is created for %s", *key)
            return True
        metrics.RECONCILES.labels(*key, "error").inc()
        log.error("Reconcile of %s/%s failed, will retry: %s: %s", *key, type(exc).__name__, exc)
        log.debug("Reconcile of %s/%s failed", *key, exc_info=True)
        return False
    finally:
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
    for written in outcome.written:
        memo.overlay.record(key, written)
    if outcome.requeue_after is not None:
        memo.queue.add_after(key, outcome.requeue_after)
    metrics.RECONCILES.labels(*key, outcome.result).inc()
    return not outcome.retry  # retried after the queue's back-off


async def _reconcile_snapshot(memo: OperatorState, key: Any) -> bool:
    await memo.indexed.wait()
    body = memo.snapshot_bodies.get(key)
    if body is None:
        return True
    namespace = key[0]
    service_name = str((body.get("spec") or {}).get("service", ""))
    service_body, observed = snapshot(memo, (namespace, service_name))
    service = snapshots.Service(service_body)
    if service_body is not None:
        service = snapshots.Service(service_body, reconcile.observe_children(service_body, observed))
    rivals = [
        snapshots.Rival(other, _service_body(memo, (namespace, str((other.get("spec") or {}).get("service", "")))))
        for other in _rivals(memo, key, body).values()
    ]
    try:
        loop = asyncio.get_running_loop()
        outcome = await loop.run_in_executor(
            memo.snapshot_pool,
            snapshots.reconcile_snapshot,
            memo.kube,
            memo.config,
            body,
            service,
            memo.snapshot_readers,
            rivals,
        )
    except Exception as exc:  # retried with backoff
        if kube.namespace_terminating(exc):
            log.info("Namespace %s is being deleted: nothing more is created for TFDataSnapshot %s", *key)
            return True
        log.error("Reconcile of TFDataSnapshot %s/%s failed, will retry: %s: %s", *key, type(exc).__name__, exc)
        log.debug("Reconcile of TFDataSnapshot %s/%s failed", *key, exc_info=True)
        return False
    # A write's answer is the object as it is now: the next reconcile starts from it, not from a
    # body the watch has not replaced yet (a stale resourceVersion would fail the finalizer's patch).
    for written in outcome.written:
        if key in memo.snapshot_bodies and written.get("metadata", {}).get("name") == key[1]:
            memo.snapshot_bodies[key] = {**memo.snapshot_bodies[key], **written}
    if outcome.result == snapshots.RELEASED:
        memo.snapshots_released.add(body["metadata"].get("uid"))
        memo.snapshot_bodies.pop(key, None)
        _queue_rivals(memo, key, body)
    elif outcome.requeue_after is not None:
        memo.snapshot_queue.add_after(key, outcome.requeue_after)
    return True


def new_memo(config: OperatorConfig) -> OperatorState:
    return OperatorState(config)
