"""Leader election on a ``coordination.k8s.io/v1`` Lease: one operator process reconciles, the others stand by.

The semantics are client-go's (``tools/leaderelection``), which controller-runtime operators use:

- Every ``retry_period`` a candidate reads the Lease. It takes it when nobody holds it, or when the
  holder has not renewed it for the holder's ``leaseDurationSeconds``, measured on the candidate's
  own monotonic clock from the moment it saw the Lease change (no comparison of two hosts' clocks).
- The leader renews it every ``retry_period``. Once ``renew_deadline`` has passed since the last
  renewal it sent, it stops writing at once (``writing`` refuses) and the process exits non-zero,
  so Kubernetes restarts it as a standby. ``renew_deadline < lease_duration``: the leader has
  stopped before any standby may take over.
- On a clean exit (SIGTERM: a rolling update, a drain) the leader waits for the writes in flight,
  then releases the Lease (empty holder), and a standby takes over at its next read.

Why not ``kubernetes.leaderelection`` (the official client's port): it cannot release the Lease
on a clean exit (every restart or rolling update would wait a whole lease duration; client-go's
``ReleaseOnCancel``), its requests carry no timeout (a leader stuck in a renewal keeps believing
it leads past the renew deadline, while a standby takes over), it runs the leader's work in a
thread it cannot stop, and it gives the work no way to check it still leads before each write.
Kopf's peering is no election either (see docs/operations.md, "A standby operator").

The decisions (``Elector.attempt``) are plain code over a ``Leases`` door, unit-tested with an
in-memory Lease and a fake clock; ``KubeLeases`` is the door to the API server.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from tfdata_operator.controller import metrics
from tfdata_operator.controller.config import ElectionConfig
from tfdata_operator.controller.kube import Kube, describe_api_error
from tfdata_operator.plan.children import LEASE, path

log = logging.getLogger(__name__)
# What a leader that lost its Lease exits with (controller-runtime's manager exits 1 as well).
LOST_EXIT_CODE = 1
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
Lease = dict[str, Any]


def default_namespace() -> str | None:
    """The operator pod's own namespace, when it runs in one."""
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip() or None
    except OSError:
        return None


class Leases(Protocol):
    """The one Lease: read it (None when it does not exist), create it, replace it (409 on a stale resourceVersion)."""

    def get(self, timeout: float) -> Lease | None: ...

    def create(self, lease: Lease, timeout: float) -> Lease: ...

    def replace(self, lease: Lease, timeout: float) -> Lease: ...


class KubeLeases:
    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self.kube = kube
        self.collection = path(LEASE.api_version, LEASE.kind, namespace)
        self.url = path(LEASE.api_version, LEASE.kind, namespace, name)

    def get(self, timeout: float) -> Lease | None:
        try:
            return self.kube.call("GET", self.url, timeout=timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, lease: Lease, timeout: float) -> Lease:
        return self.kube.call("POST", self.collection, body=lease, timeout=timeout)

    def replace(self, lease: Lease, timeout: float) -> Lease:
        return self.kube.call("PUT", self.url, body=lease, timeout=timeout)


class NotLeading(RuntimeError):
    """A write was refused: this process does not (or no longer surely) hold the Lease."""


def micro_time(now: datetime) -> str:
    """A Lease's MicroTime: always six fraction digits and a Z (the API server parses RFC 3339 with micros)."""
    return now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    def __init__(
        self,
        leases: Leases,
        config: ElectionConfig,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    ) -> None:
        self.leases, self.config, self.timing = leases, config, config.timing
        self.identity = config.identity
        self._clock, self._wall = clock, wall
        self._observed: dict[str, Any] | None = None  # the Lease's spec as last read or written
        self._observed_at = 0.0  # when it last changed, on our clock
        self._renewed_at: float | None = None  # when the last successful renewal was sent
        self._lock = threading.Condition()
        self._writers = 0
        self._stopping = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.leading = False
        self.holder = ""  # who holds the Lease, as last seen

    @property
    def where(self) -> str:
        return f"{self.config.namespace}/{self.config.name}"

    # --- One try, as client-go's tryAcquireOrRenew ---------------------------------------------

    def attempt(self, timeout: float) -> bool:
        """Reads the Lease and takes or renews it if it may: True when this process holds it now."""
        sent = self._clock()
        lease = self.leases.get(timeout)
        if lease is None:
            created = self.leases.create(self._lease({}, None), timeout)
            return self._took(created, sent)
        spec = lease.get("spec") or {}
        if spec != self._observed:
            self._observed, self._observed_at = spec, self._clock()
        self.holder = spec.get("holderIdentity") or ""
        if self.holder and self.holder != self.identity:
            duration = spec.get("leaseDurationSeconds") or self.timing.lease_duration
            if self._clock() < self._observed_at + duration:
                return False  # held, and renewed within its duration as far as we have seen
        try:
            replaced = self.leases.replace(self._lease(spec, lease), timeout)
        except ApiException as exc:
            if exc.status == 409:  # another candidate wrote it since our read
                return False
            raise
        return self._took(replaced, sent)

    def _lease(self, spec: dict[str, Any], current: Lease | None) -> Lease:
        now = micro_time(self._wall())
        ours = spec.get("holderIdentity") == self.identity
        transitions = int(spec.get("leaseTransitions") or 0)
        metadata: dict[str, Any] = {"name": self.config.name, "namespace": self.config.namespace}
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        return {
            "apiVersion": LEASE.api_version,
            "kind": LEASE.kind,
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.timing.lease_duration,
                "acquireTime": spec.get("acquireTime") if ours else now,
                "renewTime": now,
                "leaseTransitions": transitions if ours or current is None else transitions + 1,
            },
        }

    def _took(self, lease: Lease, sent: float) -> bool:
        self._observed, self._observed_at = lease.get("spec") or {}, self._clock()
        self.holder = self.identity
        self._renewed_at = sent
        return True

    # --- Who may write -------------------------------------------------------------------------

    def holds(self) -> bool:
        """True while this process leads and its last renewal is within the renew deadline."""
        return (
            self.leading
            and not self._stopping
            and self._renewed_at is not None
            and self._clock() < self._renewed_at + self.timing.renew_deadline
        )

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Wraps every request of the reconcile loop: refused unless this process surely leads."""
        with self._lock:
            if not self.holds():
                raise NotLeading(f"this operator does not hold the Lease {self.where}: it writes nothing")
            self._writers += 1
        try:
            yield
        finally:
            with self._lock:
                self._writers -= 1
                self._lock.notify_all()

    # --- The loop -------------------------------------------------------------------------------

    def start(self, started: Callable[[], object], lost: Callable[[str], None]) -> None:
        """Runs the election in a thread of its own (independent of the event loop and the reconciles)."""
        self._thread = threading.Thread(target=self.run, args=(started, lost, self._stop), name="leader-election")
        self._thread.daemon = True
        self._thread.start()

    def run(self, started: Callable[[], object], lost: Callable[[str], None], stop: threading.Event) -> None:
        """Stands by until it takes the Lease, calls ``started``, then renews until ``stop`` is set.
        ``lost`` is called (and need not return) when the Lease is lost: taken by another, or not
        renewed within the renew deadline."""
        timing = self.timing
        log.info(
            "Leader election on the Lease %s as %s (lease %d s, renew deadline %.1f s, retry every %.1f s)",
            self.where, self.identity, timing.lease_duration, timing.renew_deadline, timing.retry_period,
        )  # fmt: skip
        waiting_since, told = self._clock(), ""
        while not stop.is_set():
            if self.leading:
                left = (self._renewed_at or 0.0) + timing.renew_deadline - self._clock()
                ok, why = self._try(max(0.1, min(timing.retry_period, left)))
                if stop.is_set():
                    return
                if not ok and (self.holder != self.identity or not self.holds()):
                    with self._lock:
                        self.leading = False
                    metrics.LEADER.set(0)
                    lost(why or f"not renewed within the renew deadline of {timing.renew_deadline} s")
                    return
            else:
                ok, why = self._try(timing.retry_period)
                if ok and not stop.is_set():
                    with self._lock:
                        self.leading = True
                    metrics.LEADER.set(1)
                    log.info("Leading: took the Lease %s after %.1f s", self.where, self._clock() - waiting_since)
                    started()
                elif why and why != told:
                    told = why
                    log.warning("Could not read or take the Lease %s: %s", self.where, why)
                elif not why and self.holder and self.holder != told:
                    told = self.holder
                    log.info("Standing by: the Lease %s is held by %s", self.where, self.holder)
            stop.wait(timing.retry_period)

    def stop(self, wait: float) -> None:
        """On a clean exit: stops the election thread, then releases the Lease (``release``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timing.renew_deadline)
        self.release(wait)

    def _try(self, timeout: float) -> tuple[bool, str]:
        try:
            ok = self.attempt(timeout)
        except ApiException as exc:
            return False, f"the API server answered {exc.status}: {describe_api_error(exc)}"
        except Exception as exc:  # unreachable, timed out: the next try may do
            return False, f"{type(exc).__name__}: {exc}"
        if not ok and self.leading and self.holder != self.identity:
            return False, f"the Lease is held by {self.holder}"
        return ok, ""

    def release(self, wait: float) -> None:
        """On a clean exit: refuses new writes, waits up to ``wait`` s for those in flight, and
        hands the Lease back so that a standby takes over at once (client-go's ReleaseOnCancel)."""
        with self._lock:
            self._stopping = True
            self._lock.wait_for(lambda: self._writers == 0, timeout=wait)
            busy = self._writers
            still = self.leading and self._renewed_at is not None
            self.leading = False
        metrics.LEADER.set(0)
        if not still:
            return
        if busy or self._clock() >= (self._renewed_at or 0) + self.timing.renew_deadline:
            log.warning("Not releasing the Lease %s (%d writes in flight): it expires by itself", self.where, busy)
            return
        try:
            lease = self.leases.get(self.timing.retry_period)
            spec = (lease or {}).get("spec") or {}
            if lease is None or spec.get("holderIdentity") != self.identity:
                return
            now = micro_time(self._wall())
            freed = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1, "acquireTime": now, "renewTime": now}
            self.leases.replace({**lease, "spec": freed}, self.timing.retry_period)
            log.info("Released the Lease %s", self.where)
        except Exception as exc:  # it expires by itself
            log.warning("Could not release the Lease %s: %s", self.where, exc)


def exit_lost(where: str) -> Callable[[str], None]:
    """What a leader does on losing its Lease: stop at once, every thread with it, and let Kubernetes restart it."""

    def lost(why: str) -> None:
        log.error("Lost the Lease %s (%s): exiting with %d to restart as a standby", where, why, LOST_EXIT_CODE)
        logging.shutdown()
        os._exit(LOST_EXIT_CODE)

    return lost
