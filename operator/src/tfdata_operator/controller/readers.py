"""The operator's reads of a service's pods, and how they are bounded: the dispatcher's ``/v1/signals``
and ``/v1/snapshots`` (for the TFData autoscaler, the hold, the drain budget, ``spec.lifecycle``
and a TFDataSnapshot's status), a server's ``/readyz`` (why it is not ready) and ``/serverinfo``.

The pods are the tenants', so a read costs a reconcile thread at most a bounded time, and a pod
that does not answer costs little more than nothing:

- the deadline: one read is bounded as a whole (``probes.request``: ``probes.TIMEOUT_SECONDS``,
  ``SNAPSHOTS_TIMEOUT_SECONDS`` for ``/v1/snapshots``), never follows a redirect, and reads a
  bounded body;
- the back-off (``Backoff``): a pod whose read failed (no whole answer in time, refused, garbled,
  an error or a redirect) is not asked again for 5 s, then 10, 20, ... up to 2 minutes, until it
  answers once;
- the cap per namespace (``NamespaceCap``): at most ``READS_PER_NAMESPACE`` reads of one
  namespace's pods at once (2 of the 8 reconcile threads by default), so slow pods of one
  namespace leave the other threads to everyone else. A read beyond it is not waited for. The
  background pool of ``/serverinfo`` reads (``cache.Background``, 4 threads) has a cap of its own,
  so one namespace's slow dispatchers delay no other service's ``status.server``.

A read not made (backed off, or over the cap) is an ``Unasked`` answer: an unreadable one, which
every decision already treats as "cannot tell" (fail closed: a held change stays held, drains stay
held, nobody is taken for idle); its words say why, and the reconcile comes back after its
``retry_after`` (the back-off's end, or ``BUSY_RETRY_SECONDS``), not sooner.
"""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.parse
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

from tfdata_operator.api import spec
from tfdata_operator.autoscaling import readings
from tfdata_operator.controller import cache, probes
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.plan import desired, drain, hold, scaling
from tfdata_operator.render import builders
from tfdata_operator.wire import serverinfo, signals, snapshots
from tfdata_operator.wire.serverinfo import ServerInfo
from tfdata_operator.wire.signals import ServiceSignals
from tfdata_operator.wire.snapshots import SnapshotsReport

Manifest = dict[str, Any]
T = TypeVar("T")

# The back-off of a pod that did not answer: the first wait, doubled at each failure up to the last.
BACKOFF_FIRST_SECONDS = 5.0
BACKOFF_MAX_SECONDS = 120.0
# Reads of one namespace's pods under way at once, per pool (the services' 8 reconcile threads by
# default, the TFDataSnapshots' 4): slow pods of one namespace hold at most this many threads.
READS_PER_NAMESPACE = 2
# A reconcile whose read was over the cap comes back after this long (the queue runs it once,
# however many ask), instead of waiting on a thread.
BUSY_RETRY_SECONDS = 2.0
# A dispatcher's /serverinfo is read again after this long when it did not answer.
SERVER_INFO_RETRY_SECONDS = 300.0
UNREADABLE = "this operator has no way to read it"


class Unasked(str):
    """Why a pod was not asked this time, as an unreadable answer's words; ``retry_after``: when to
    come back; ``busy``: not asked for its namespace's cap (it may well answer), not for a back-off."""

    retry_after: float
    busy: bool

    def __new__(cls, text: str, retry_after: float, busy: bool = False) -> Unasked:
        made = super().__new__(cls, text)
        made.retry_after, made.busy = retry_after, busy
        return made


@dataclass
class Backoff:
    """The pods that did not answer, each not asked again before its back-off has passed."""

    first: float = BACKOFF_FIRST_SECONDS
    most: float = BACKOFF_MAX_SECONDS
    # By pod: until when it is not asked, the wait that led there, and its last failure's words.
    _failed: dict[Hashable, tuple[float, float, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def held(self, key: Hashable, now: float) -> tuple[float, float, str] | None:
        """The seconds left of ``key``'s back-off, its whole length and why, or None: it may be asked."""
        with self._lock:
            failed = self._failed.get(key)
        if failed is None or now >= failed[0]:
            return None
        return failed[0] - now, failed[1], failed[2]

    def failed(self, key: Hashable, now: float, why: str) -> float:
        """A read of ``key`` failed at ``now``: the next waits twice as long as the last (the first
        ``first``), up to ``most``. Returns that wait."""
        with self._lock:
            # Pods that answered nothing for long are gone, or will be asked anew: forget them.
            for old in [k for k, (until, _, _) in self._failed.items() if now - until > 2 * self.most]:
                del self._failed[old]
            last = self._failed.get(key)
            wait = self.first if last is None else min(self.most, 2 * last[1])
            self._failed[key] = (now + wait, wait, why)
            return wait

    def answered(self, key: Hashable) -> None:
        """A good answer: the next failure starts again from ``first``."""
        with self._lock:
            self._failed.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._failed)


@dataclass
class NamespaceCap:
    """How many reads of each namespace's pods are under way; at most ``most`` at once."""

    most: int = READS_PER_NAMESPACE
    _reading: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @contextlib.contextmanager
    def slot(self, namespace: str) -> Iterator[bool]:
        """Whether a read of ``namespace`` may start now (never waits); the slot is held until the block ends."""
        taken = self.take(namespace)
        try:
            yield taken
        finally:
            if taken:
                self.give_back(namespace)

    def take(self, namespace: str) -> bool:
        """A slot for a read of ``namespace``, if one is free (never waits); ``give_back`` frees it."""
        with self._lock:
            taken = self._reading.get(namespace, 0) < self.most
            if taken:
                self._reading[namespace] = self._reading.get(namespace, 0) + 1
            return taken

    def give_back(self, namespace: str) -> None:
        with self._lock:
            left = self._reading[namespace] - 1
            if left:
                self._reading[namespace] = left
            else:
                del self._reading[namespace]

    def under_way(self, namespace: str) -> int:
        with self._lock:
            return self._reading.get(namespace, 0)


def bounded(
    backoff: Backoff,
    cap: NamespaceCap,
    clock: Callable[[], float],
    pod: tuple[str, Hashable],
    url: str,
    read: Callable[[], T],
    failure: Callable[[T], str | None] | None,
    unasked: Callable[[Unasked], T],
) -> T:
    """``read()`` of the pod ``pod`` (namespace, key) at ``url``, unless the pod is backed off (for that
    endpoint: ``url``'s path) or its
    namespace has ``cap.most`` reads under way: then ``unasked`` of why (at once). ``failure`` says
    whether an answer is a failed read (its words) for the back-off (None: no answer moves it)."""
    namespace = pod[0]
    # Each endpoint apart: an older server without one answers the others.
    key = (pod, urllib.parse.urlsplit(url).path)
    held = backoff.held(key, clock())
    if held is not None:
        # The last failure's own words: what the status said after it, it keeps saying (no write).
        return unasked(Unasked(held[2], held[0]))
    with cap.slot(namespace) as free:
        if not free:
            return unasked(
                Unasked(
                    f"{url} was not asked this time: {cap.most} reads of namespace {namespace}'s pods were under way "
                    f"(at most {cap.most} at once)",
                    BUSY_RETRY_SECONDS,
                    busy=True,
                )
            )
        answer = read()
    if failure is None:
        return answer
    failed = failure(answer)
    if failed is None:
        backoff.answered(key)
    else:
        backoff.failed(key, clock(), failed)
    return answer


def _failed_document(answer: object) -> str | None:
    return answer if isinstance(answer, str) else None


@dataclass
class Readers:
    """How the operator reads a service's pods (a fake in tests), and what it keeps of their answers
    between reconciles: the TFData autoscaler's readings, the budget's last reads, what each
    dispatcher runs, the diagnosis's last reads (Events, /readyz, Nodes), the back-off and the cap."""

    # The TFData autoscaler's readings of each service's signals (its windows).
    windows: readings.Windows = field(default_factory=readings.Windows)
    # The dispatcher's /v1/signals: for the autoscaler, the hold, the budget and spec.lifecycle.
    fetch: Callable[[str], ServiceSignals | str] = probes.fetch
    # The dispatcher's /v1/snapshots: read only when a change would take workers away (the hold).
    fetch_snapshots: Callable[[str], SnapshotsReport | str] = probes.fetch_snapshots
    # What a running but unready server says on its /readyz (for the status's explanation).
    read_readiness: Callable[[str], str | None] = probes.read_readiness
    clock: Callable[[], float] = time.time
    # The Warning Events about objects of a kind, by (namespace, kind); each /readyz answer, by URL.
    events: cache.Recent[list[Manifest]] = field(default_factory=cache.Recent)
    readiness: cache.Recent[str | None] = field(default_factory=cache.Recent)
    # The last signal read for a static service's disruption budget, with when: by (namespace, name).
    drains: cache.Recent[tuple[float, hold.Signal]] = field(default_factory=cache.Recent)
    # The last snapshots read for the budget of a service with spec.snapshots, with when: by (namespace, name).
    drain_snapshots: cache.Recent[tuple[float, hold.Snapshots]] = field(default_factory=cache.Recent)
    # What each ready dispatcher pod runs (its /serverinfo), by pod uid: read once, off the reconcile.
    read_server_info: Callable[[str], ServerInfo | None] = field(default=lambda url: probes.read_server_info(url))
    server_info: cache.Background[ServerInfo] = field(default_factory=cache.Background)
    # The /serverinfo reads of each namespace under way in that background pool.
    server_info_cap: NamespaceCap = field(default_factory=NamespaceCap)
    # The Nodes of unready pods, and a lost dispatcher's journal claim and volume, by (kind, name):
    # each kept for a few seconds (``run.NODE_READ_SECONDS``).
    nodes: cache.Recent[Manifest | None] = field(default_factory=cache.Recent)
    # Pods that did not answer, and the reads of each namespace under way.
    backoff: Backoff = field(default_factory=Backoff)
    cap: NamespaceCap = field(default_factory=NamespaceCap)


@dataclass(frozen=True)
class Dispatcher:
    """A service's dispatcher as one reconcile asks it: where, and as which pod (the back-off's key)."""

    svc: spec.ServiceSpec
    config: OperatorConfig
    children: desired.Children

    def url(self, path: str = signals.SIGNALS_PATH) -> str:
        return dispatcher_url(self.svc, self.config, self.children, path)

    def pod(self) -> tuple[str, Hashable]:
        """The pod a read goes to: its name, uid and address (a new pod, or a new address, starts
        afresh), else (through the Service) the Service's address."""
        chosen = _dispatcher_pod(self.children)
        if chosen is None:
            return self.svc.namespace, urllib.parse.urlsplit(self.url()).netloc
        meta = chosen["metadata"]
        return self.svc.namespace, (meta["name"], meta.get("uid"), chosen["status"]["podIP"])


def dispatcher_url(
    svc: spec.ServiceSpec, config: OperatorConfig, children: desired.Children, path: str = signals.SIGNALS_PATH
) -> str:
    """The dispatcher pod's ``/v1/signals`` (or another ``path`` on its health port): by the pod's IP
    where the cache knows it (an operator outside the cluster cannot resolve Service names), else
    through the dispatcher Service."""
    pod = _dispatcher_pod(children)
    if pod is not None:
        return f"http://{pod['status']['podIP']}:{svc.dispatcher.health_port}{path}"
    return builders.dispatcher_health_url(svc, config.build, path)


def _dispatcher_pod(children: desired.Children) -> Manifest | None:
    for pod in children.pods_of(builders.DISPATCHER):
        if (pod.get("status") or {}).get("podIP") and not pod["metadata"].get("deletionTimestamp"):
            return pod
    return None


def read_signals(readers: Readers | None, dispatcher: Dispatcher) -> ServiceSignals | str:
    """The dispatcher's ``/v1/signals``, or why not (an ``Unasked`` when it was not asked)."""
    return UNREADABLE if readers is None else _read(readers, dispatcher, signals.SIGNALS_PATH, readers.fetch)


def read_snapshots(readers: Readers | None, dispatcher: Dispatcher) -> SnapshotsReport | str:
    """The dispatcher's ``/v1/snapshots``, or why not (an ``Unasked`` when it was not asked)."""
    if readers is None:
        return UNREADABLE
    return _read(readers, dispatcher, snapshots.SNAPSHOTS_PATH, readers.fetch_snapshots)


def _read(readers: Readers, dispatcher: Dispatcher, path: str, fetch: Callable[[str], T | str]) -> T | str:
    url = dispatcher.url(path)
    return bounded(
        readers.backoff, readers.cap, readers.clock, dispatcher.pod(), url, lambda: fetch(url), _failed_document, _why
    )


def _why(why: Unasked) -> str:
    return why


def retry_after(*answers: object) -> float | None:
    """The longest ``retry_after`` of the answers that were not asked (None: all were)."""
    waits = [a.retry_after for a in answers if isinstance(a, Unasked)]
    waits += [a.why.retry_after for a in answers if isinstance(a, hold.Unknown) and isinstance(a.why, Unasked)]
    return max(waits) if waits else None


def _unknown(answer: T | str) -> T | hold.Unknown:
    return hold.Unknown(answer) if isinstance(answer, str) else answer


def for_hold(
    readers: Readers | None, dispatcher: Dispatcher, pending: hold.Pending | None, running: bool
) -> tuple[hold.Snapshots | None, hold.Signal | None]:
    """What the hold decision reads: the dispatcher's snapshots if it depends on them, and its signal
    only if, besides, no snapshot holds the change already. Read on every reconcile that has a change
    to decide (a held change comes back for it)."""
    svc = dispatcher.svc
    saves = _unknown(read_snapshots(readers, dispatcher)) if hold.needs_snapshots(svc, pending, running) else None
    signal: hold.Signal | None = None
    if hold.needs_signal(svc, pending, running) and hold.writing(svc, saves) is None:
        signal = _unknown(read_signals(readers, dispatcher))
    return saves, signal


R = TypeVar("R")


def kept_signal(readers: Readers | None, dispatcher: Dispatcher) -> tuple[hold.Signal, float | None]:
    """The signal for the workers' budget, read at most once per ``drain.valid_for`` of the last
    answer; with when the reconcile should come back for the next."""
    if readers is None:
        return hold.Unknown(UNREADABLE), None
    return _kept(readers, readers.drains, lambda: read_signals(readers, dispatcher), dispatcher, drain.valid_for)


def kept_snapshots(readers: Readers | None, dispatcher: Dispatcher) -> tuple[hold.Snapshots, float | None]:
    """The dispatcher's snapshots, read at most once per ``drain.RECHECK_SECONDS`` (for the budget,
    and for a worker on an unreachable node: both want to know whether one is being written)."""
    if readers is None:
        return hold.Unknown(UNREADABLE), None
    kept = readers.drain_snapshots
    return _kept(readers, kept, lambda: read_snapshots(readers, dispatcher), dispatcher, drain.snapshots_valid_for)


def _kept(
    readers: Readers,
    kept: cache.Recent[tuple[float, R | hold.Unknown]],
    read: Callable[[], R | str],
    dispatcher: Dispatcher,
    valid_for: Callable[[R | hold.Unknown], float],
) -> tuple[R | hold.Unknown, float]:
    """An answer of the dispatcher, read at most once per ``valid_for`` of the last one (kept in
    ``kept``), and when to come back: when it expires (every reconcile asks for that same moment, so
    the queue runs one), or, when the pod was not asked, when it may be. An answer not asked is not
    kept: the next reconcile after that asks. Over the cap, the last answer stands meanwhile (the
    read is not done this time: nothing is decided anew from it)."""
    clock, key = readers.clock(), (dispatcher.svc.namespace, dispatcher.svc.name)

    def fresh() -> tuple[float, R | hold.Unknown]:
        return clock, _unknown(read())

    last = kept.last(key)
    read_at, answer = kept.get(key, fresh, clock, lambda k: valid_for(k[1]), keep=lambda k: retry_after(k[1]) is None)
    wait = retry_after(answer)
    if wait is None:
        return answer, max(0.5, read_at + valid_for(answer) - clock)
    if last is not None and _busy(answer):
        return last[1], wait
    return answer, wait


def _busy(answer: object) -> bool:
    return isinstance(answer, hold.Unknown) and isinstance(answer.why, Unasked) and answer.why.busy


def readiness(readers: Readers, pod: Manifest, health_port: int, ttl: float) -> str | None:
    """What an unready server says on its ``/readyz``, kept ``ttl`` (None: nothing, or not asked)."""
    url = f"http://{pod['status']['podIP']}:{health_port}/readyz"
    meta = pod["metadata"]
    key = (meta["namespace"], (meta["name"], meta.get("uid"), pod["status"]["podIP"]))
    unasked: list[Unasked] = []

    def not_asked(why: Unasked) -> None:
        unasked.append(why)

    def read() -> str | None:
        return bounded(
            readers.backoff,
            readers.cap,
            readers.clock,
            key,
            url,
            lambda: readers.read_readiness(url),
            lambda detail: "no answer" if detail is None else None,
            not_asked,
        )

    # A pod not asked is asked by the next reconcile that wants it (after its back-off), not a resync later.
    return readers.readiness.get(url, read, readers.clock(), ttl, keep=lambda _: not unasked)


def server_info(
    readers: Readers, pods: list[Manifest], reported: str | None, health_port: int
) -> tuple[dict[str, Any], float | None]:
    """What the ready dispatcher pod runs (``Servers.server_info``/``server_pod``), when it is known
    and not yet in the status (``reported``: the pod the status names; nothing keeps the status's).
    Read in the background once per pod; the reconcile that starts the read comes back for its
    answer (the seconds after which, or None)."""
    pod = next((p for p in pods if _ready(p)), None)
    if pod is None:
        return {}, None
    uid = str(pod["metadata"].get("uid"))
    key = f"{pod['metadata']['name']}/{uid}"
    if reported == key:
        return {}, None
    url = f"http://{pod['status']['podIP']}:{health_port}{serverinfo.INFO_PATH}"
    namespace, busy = str(pod["metadata"].get("namespace")), []

    def admit() -> bool:
        """A read starts only in a free slot of the pod's namespace (``server_info_cap``)."""
        if readers.server_info_cap.take(namespace):
            return True
        busy.append(namespace)
        return False

    def read() -> ServerInfo | None:
        try:
            return readers.read_server_info(url)
        finally:
            readers.server_info_cap.give_back(namespace)

    info = readers.server_info.get(uid, read, readers.clock(), SERVER_INFO_RETRY_SECONDS, admit)
    if info is None:
        # Under way, or answered since ``get`` returned (a read faster than this reconcile): come
        # back for the answer. In this order, one of the two holds for a read that will answer.
        if readers.server_info.reading(uid) or readers.server_info.answered(uid):
            return {}, 2.0
        # Not started: the namespace's other dispatchers hold its slots. Ask again soon, not in 5 minutes.
        return {}, BUSY_RETRY_SECONDS if busy else None
    return {"server_info": info, "server_pod": key}, None


def _ready(pod: Manifest) -> bool:
    """A pod that can be asked: Ready, with an address, not going away."""
    status = pod.get("status") or {}
    return scaling.pod_ready(pod) and bool(status.get("podIP")) and pod["metadata"].get("deletionTimestamp") is None


@dataclass
class SnapshotReaders:
    """How a TFDataSnapshot's dispatcher is asked (a fake in unit tests), with the same back-off and
    cap as a service's pods (their own: the TFDataSnapshots have their own threads)."""

    fetch: Callable[[str], SnapshotsReport | str] = probes.fetch_snapshots
    delete: Callable[[str], str | None] = probes.delete_snapshot
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(timezone.utc))
    # The back-off's clock, in seconds.
    seconds: Callable[[], float] = time.monotonic
    backoff: Backoff = field(default_factory=Backoff)
    cap: NamespaceCap = field(default_factory=NamespaceCap)

    def read(self, namespace: str, url: str) -> SnapshotsReport | str:
        """The dispatcher's ``/v1/snapshots?path=`` at ``url``, or why not (an ``Unasked`` when it was not asked)."""
        pod = (namespace, urllib.parse.urlsplit(url).netloc)
        fetch = self.fetch
        return bounded(
            self.backoff, self.cap, self.seconds, pod, url, lambda: fetch(url), _failed_document, lambda why: why
        )

    def remove(self, namespace: str, url: str) -> str | None:
        """The dispatcher's ``DELETE`` at ``url``: None once deleted, else why not. A dispatcher backed
        off for its reads is not asked (an ``Unasked``); a refusal is an answer, so only reads move
        the back-off."""
        pod = (namespace, urllib.parse.urlsplit(url).netloc)
        delete = self.delete
        return bounded(self.backoff, self.cap, self.seconds, pod, url, lambda: delete(url), None, _why)
