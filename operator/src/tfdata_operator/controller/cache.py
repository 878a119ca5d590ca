"""What the operator knows of the cluster without asking: the watches' cache, plus its own writes
and its last few reads.

kopf's indexes (one per kind in ``children.OBSERVED``, and one of TFDataServices) hold a trimmed
body of every object the operator manages, keyed by (namespace, instance), so observing a
service costs no request; one more holds each service's snapshot directory
(``plan.snapshotdir.DirectoryClaim``), keyed by its root (a bucket). Each body is kept
``Packed`` (compressed JSON) and unpacked when a reconcile looks: a body parsed from a watch
event is a tree of dicts and strings of its own, about 20 KB for a StatefulSet, and a packed one
about 0.45 KB. A write's response is newer than what the watch has delivered so far: ``Overlay``
keeps it until the watch catches up, so the next reconcile does not redo the write it just made.
What is read without a watch (the Events that say why a child is not ready, a server's
``/readyz``) ``Recent`` keeps for a while, so the reconciles that every event of a busy service
queues do not read it again each time.
"""

from __future__ import annotations

import functools
import json
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tfdata_operator.api import spec
from tfdata_operator.api.identity import API_VERSION, INSTANCE_LABEL, KIND, SNAPSHOT_KIND
from tfdata_operator.plan.desired import Children, desired_children
from tfdata_operator.render.builders import BuildSettings

Manifest = dict[str, Any]
InstanceKey = tuple[str, str]  # namespace, TFDataService name
ObjectKey = tuple[str, str]  # kind, name

_DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


def trim(body: Mapping[str, Any]) -> Manifest:
    """A body without what no decision reads: managedFields and kubectl's copy of the whole object."""
    meta = dict(body.get("metadata") or {})
    meta.pop("managedFields", None)
    if annotations := meta.get("annotations"):
        meta["annotations"] = {k: v for k, v in annotations.items() if k not in _DROPPED_ANNOTATIONS}
    return {**{k: v for k, v in body.items() if k != "metadata"}, "metadata": meta}


# What the operator reads of a TFDataSnapshot's metadata; labels, annotations and managedFields,
# which a tenant can grow to the object's ~1.5 MB, it keeps none of.
_SNAPSHOT_META = ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
                  "deletionTimestamp", "finalizers")  # fmt: skip


def trim_snapshot(body: Mapping[str, Any]) -> Manifest:
    """A TFDataSnapshot as the operator keeps it: its spec, status, finalizers and identity
    (``_SNAPSHOT_META``), nothing else of its metadata."""
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k in _SNAPSHOT_META}
    return {
        "apiVersion": API_VERSION,
        "kind": SNAPSHOT_KIND,
        "metadata": meta,
        **{k: body[k] for k in ("spec", "status") if k in body},
    }


_POD_META = ("name", "namespace", "uid", "resourceVersion", "labels", "ownerReferences",
             "creationTimestamp", "deletionTimestamp")  # fmt: skip
_CONTAINER_STATUS = ("name", "image", "ready", "started", "restartCount")
_CONDITION = ("type", "status", "reason", "message", "lastTransitionTime")
_STATE = ("reason", "message", "exitCode", "startedAt")
# Messages the kubelet or the scheduler write can be long (a whole stack's last words): the cache
# keeps what a condition would quote (diagnose.MAX_QUOTED).
_MAX_MESSAGE = 1024


def _trimmed_state(state: Mapping[str, Any] | None) -> Manifest:
    """A container state ({running|waiting|terminated: {...}}) with only what a diagnosis quotes."""
    out: Manifest = {}
    for phase, detail in (state or {}).items():
        detail = detail or {}
        kept = {k: detail[k] for k in _STATE if k in detail}
        if isinstance(kept.get("message"), str):
            kept["message"] = kept["message"][:_MAX_MESSAGE]
        out[phase] = kept
    return out


def trim_pod(body: Mapping[str, Any]) -> Manifest:
    """A pod as the scaling decisions and the status's diagnosis (``diagnose.py``) read it: identity,
    revision, readiness, why it is not scheduled or not running; of its spec, only its node (whether
    that node was lost: ``nodeloss.py``)."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    containers = _trimmed_containers(status.get("containerStatuses"))
    # Init containers (the injected server program's) only while one keeps the pod from starting.
    init_containers = _trimmed_containers(
        c for c in status.get("initContainerStatuses") or [] if (c.get("state") or {}).get("terminated") is None
    )
    conditions = []
    for cond in status.get("conditions") or []:
        kept = {k: cond[k] for k in _CONDITION if k in cond}
        if isinstance(kept.get("message"), str):
            kept["message"] = kept["message"][:_MAX_MESSAGE]
        conditions.append(kept)
    return {
        "apiVersion": body.get("apiVersion", "v1"),
        "kind": "Pod",
        "metadata": {k: meta[k] for k in _POD_META if k in meta},
        **({"spec": {"nodeName": node}} if (node := (body.get("spec") or {}).get("nodeName")) else {}),
        "status": {
            "phase": status.get("phase"),
            # The autoscaler and the hold decision read the dispatcher's signals at this address.
            "podIP": status.get("podIP"),
            "conditions": conditions,
            "containerStatuses": containers,
            **({"initContainerStatuses": init_containers} if init_containers else {}),
        },
    }


def _trimmed_containers(statuses: Iterable[Mapping[str, Any]] | None) -> list[Manifest]:
    containers = []
    for c in statuses or []:
        container = {k: c[k] for k in _CONTAINER_STATUS if k in c}
        if "state" in c:
            container["state"] = _trimmed_state(c["state"])
        if last := _trimmed_state(c.get("lastState")):
            container["lastState"] = last
        containers.append(container)
    return containers


_EVENT = ("type", "reason", "message", "lastTimestamp", "eventTime", "series")


def trim_event(body: Mapping[str, Any]) -> Manifest:
    """An Event as a diagnosis reads it (``diagnose.py``): whom it is about, its reason and message
    (cut as a pod's are), and when it was last seen."""
    event = {k: body[k] for k in _EVENT if k in body}
    if isinstance(event.get("message"), str):
        event["message"] = event["message"][:_MAX_MESSAGE]
    involved = body.get("involvedObject") or {}
    event["involvedObject"] = {k: involved[k] for k in ("kind", "name", "uid") if k in involved}
    return event


def _compact(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


@functools.cache
def _shared_text() -> bytes:
    """What the cached bodies have in common, as zlib's preset dictionary: the children of a
    default TFDataService as the operator renders them, and a pod as the cache keeps it. A body
    packed with it stores mostly what differs (a StatefulSet: 1.4 KB without, 0.45 KB with)."""
    meta = {"name": "shared", "namespace": "default", "uid": "00000000-0000-0000-0000-000000000000"}
    body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": {"shardingPolicy": "DYNAMIC"}}
    svc = spec.parse(body, "tfdata-server")
    children = desired_children(svc, BuildSettings(), Children(svc.name)).apply
    condition = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    container = {"name": "server", "image": svc.image, "ready": True, "started": True, "restartCount": 0,
                 "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}  # fmt: skip
    pod = {**children[-1], "kind": "Pod", "status": {"phase": "Running", "podIP": "10.0.0.1",
           "conditions": [condition], "containerStatuses": [container]}}  # fmt: skip
    return b"".join(_compact(m) for m in (*children, pod))[-32768:]  # zlib reads at most 32 KB of it


@dataclass(frozen=True, slots=True)
class Packed:
    """A body as the cache keeps it: compact JSON, compressed (``pack``); ``unpack`` gives a fresh copy."""

    data: bytes

    def unpack(self) -> Manifest:
        inflate = zlib.decompressobj(zdict=_shared_text())
        body: Manifest = json.loads(inflate.decompress(self.data) + inflate.flush())
        return body


def pack(body: Mapping[str, Any]) -> Packed:
    # Level 1: nearly the size of the default level at half its time (a watch event packs one body).
    deflate = zlib.compressobj(1, zdict=_shared_text())
    return Packed(deflate.compress(_compact(body)) + deflate.flush())


def instance_of(body: Mapping[str, Any]) -> InstanceKey | None:
    """The (namespace, TFDataService) a child belongs to, from its instance label."""
    meta = body.get("metadata") or {}
    instance = (meta.get("labels") or {}).get(INSTANCE_LABEL)
    return (meta.get("namespace", ""), instance) if instance else None


def _version(body: Mapping[str, Any]) -> int | None:
    try:
        return int((body.get("metadata") or {}).get("resourceVersion", ""))
    except ValueError:
        return None  # resourceVersions are opaque; etcd's are integers, others are never compared


def _newer_version(version: int | None, than: Mapping[str, Any] | None) -> bool:
    if than is None:
        return True
    other = _version(than)
    return version is not None and other is not None and version > other


@dataclass
class Overlay:
    """The operator's own recent writes, per service, until the watch delivers them (or ``ttl`` passes)."""

    ttl: float = 30.0
    clock: Callable[[], float] = time.monotonic
    # Packed as the indexes' bodies are: in a burst, every service's children wait here for the watch.
    _items: dict[InstanceKey, dict[ObjectKey, tuple[float, int | None, Packed]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, instance: InstanceKey, body: Mapping[str, Any]) -> None:
        trimmed = trim_pod(body) if body.get("kind") == "Pod" else trim(body)
        entry = (self.clock(), _version(trimmed), pack(trimmed))
        with self._lock:
            self._items.setdefault(instance, {})[(body["kind"], body["metadata"]["name"])] = entry

    def merge(self, instance: InstanceKey, cached: dict[ObjectKey, Manifest]) -> dict[ObjectKey, Manifest]:
        """``cached`` with every recorded write that the watch has not delivered yet."""
        now = self.clock()
        with self._lock:
            recorded = self._items.get(instance)
            if not recorded:
                return cached
            merged = dict(cached)
            for key, (written, version, body) in list(recorded.items()):
                live = cached.get(key)
                if now - written > self.ttl or (live is not None and not _newer_version(version, live)):
                    del recorded[key]  # the watch caught up (or the write was overtaken)
                else:
                    merged[key] = body.unpack()
            if not recorded:
                del self._items[instance]
            return merged

    def forget(self, instance: InstanceKey) -> None:
        with self._lock:
            self._items.pop(instance, None)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._items.values())


def by_key(packed: Iterable[Packed]) -> dict[ObjectKey, Manifest]:
    """Cached bodies unpacked (each a fresh copy), by (kind, name)."""
    bodies = (p.unpack() for p in packed)
    return {(b["kind"], b["metadata"]["name"]): b for b in bodies}


T = TypeVar("T")


@dataclass
class Recent(Generic[T]):
    """Answers of reads the watches do not cover, each kept for ``ttl`` seconds (the caller's resync):
    a key is read at most once per ``ttl``, however many reconciles ask for it meanwhile."""

    _items: dict[Hashable, tuple[float, T]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(
        self,
        key: Hashable,
        read: Callable[[], T],
        now: float,
        ttl: float | Callable[[T], float],
        keep: Callable[[T], bool] = lambda _: True,
    ) -> T:
        """The answer read for ``key`` less than ``ttl`` seconds before ``now``, else ``read()``'s (kept,
        unless ``keep`` of it is False). A callable ``ttl`` gives each answer its own lifetime."""
        life: Callable[[T], float] = ttl if callable(ttl) else (lambda _: ttl)
        with self._lock:
            kept = self._items.get(key)
        if kept is not None and now - kept[0] < life(kept[1]):
            return kept[1]
        value = read()  # outside the lock: reads of other keys go on meanwhile
        with self._lock:
            # Forget what expired a while ago, so keys of objects that are gone do not pile up (``last``
            # still has what expired a moment ago).
            for old in [k for k, (when, v) in self._items.items() if now - when >= 2 * life(v)]:
                del self._items[old]
            if keep(value):
                self._items[key] = (now, value)
        return value

    def last(self, key: Hashable) -> T | None:
        """The answer last kept for ``key``, however old (None: none)."""
        with self._lock:
            kept = self._items.get(key)
        return None if kept is None else kept[1]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


@dataclass
class Latest(Generic[T]):
    """The values last put for at most ``most`` keys (the least recently put is forgotten first): what
    the operator remembers of its own writes that no watch shows it, such as the Events it recorded."""

    most: int
    _items: OrderedDict[Hashable, T] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, key: Hashable) -> T | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: Hashable, value: T) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.most:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


@dataclass
class Background(Generic[T]):
    """Answers read off the reconcile's thread, for reads that may be slow or never answer (a pod's
    HTTP endpoint). ``get`` returns at once what was read for a key, None before an answer, and
    starts a read in the background when there is no answer yet and no read for ``ttl`` seconds.
    An answer is kept until the key has not been asked for ``ttl`` (the keys name what cannot
    change, such as one pod's program)."""

    workers: int = 4
    _answers: dict[Hashable, T] = field(default_factory=dict)
    # When each key was last asked for, and last read.
    _asked: dict[Hashable, float] = field(default_factory=dict)
    _tried: dict[Hashable, float] = field(default_factory=dict)
    _reading: set[Hashable] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _pool: ThreadPoolExecutor | None = None

    def get(
        self,
        key: Hashable,
        read: Callable[[], T | None],
        now: float,
        ttl: float,
        admit: Callable[[], bool] | None = None,
    ) -> T | None:
        """``admit``, asked only when a read would start: whether it may (False: not started, nor
        counted as tried, so the next ``get`` asks again)."""
        with self._lock:
            self._asked[key] = now
            for old in [k for k, when in self._asked.items() if now - when >= ttl]:
                for table in (self._asked, self._tried, self._answers):
                    table.pop(old, None)
            answer = self._answers.get(key)
            due = answer is None and now - self._tried.get(key, -ttl) >= ttl
            if due and (admit is None or admit()):
                self._tried[key] = now
                self._reading.add(key)
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="background-read")
                self._pool.submit(self._read, key, read)
            return answer

    def _read(self, key: Hashable, read: Callable[[], T | None]) -> None:
        value = None
        try:
            value = read()
        finally:
            with self._lock:
                self._reading.discard(key)
                if value is not None and key in self._asked:
                    self._answers[key] = value

    def wait(self, timeout: float = 10.0) -> None:
        """Until no read is under way (for tests), at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._reading:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"reads still under way after {timeout}s: {sorted(map(str, self._reading))}")
            time.sleep(0.01)

    def reading(self, key: Hashable) -> bool:
        """Whether a read of ``key`` is under way (its answer may come a moment later)."""
        with self._lock:
            return key in self._reading

    def answered(self, key: Hashable) -> bool:
        """Whether an answer for ``key`` is kept (``get`` returns it)."""
        with self._lock:
            return key in self._answers

    def __len__(self) -> int:
        with self._lock:
            return len(self._answers)
