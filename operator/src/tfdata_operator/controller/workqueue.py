"""One de-duplicating work queue of TFDataServices, drained by a few workers.

Every trigger (the service's own events, a child's or a pod's event, the periodic resync)
adds (namespace, name). A key already waiting is not added twice, and a key added while
its reconcile runs is run once more afterwards, so a burst of events for one service
becomes one reconcile, and one service is never reconciled twice at once (the semantics of
client-go's workqueue). A failed reconcile is retried with a per-service exponential
backoff, so a service that keeps failing costs one attempt a minute, not a retry storm.

Runs on the operator's event loop; ``add_threadsafe`` is for other threads.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable

from tfdata_operator.controller import metrics

Key = Hashable


class WorkQueue:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._order: deque[Key] = deque()
        self._waiting: dict[Key, float] = {}  # key -> when it was added
        self._active: set[Key] = set()
        self._again: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._ready = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, key: Key) -> None:
        if key in self._active:
            self._again.add(key)
        elif key not in self._waiting:
            self._waiting[key] = self._clock()
            self._order.append(key)
            self._ready.set()
            metrics.QUEUE_DEPTH.set(len(self._waiting))

    def add_threadsafe(self, key: Key) -> None:
        self._loop.call_soon_threadsafe(self.add, key)

    def add_after(self, key: Key, delay: float) -> None:
        self._loop.call_later(delay, self.add, key)

    async def get(self) -> Key:
        while not self._order:
            self._ready.clear()
            await self._ready.wait()
        key = self._order.popleft()
        metrics.QUEUE_WAIT_SECONDS.observe(self._clock() - self._waiting.pop(key))
        metrics.QUEUE_DEPTH.set(len(self._waiting))
        self._active.add(key)
        return key

    def done(self, key: Key, failed: bool = False) -> None:
        self._active.discard(key)
        if failed:
            self._failures[key] = attempts = self._failures.get(key, 0) + 1
            self.add_after(key, backoff(attempts))
            self._again.discard(key)  # the retry comes after the backoff, not at once
            return
        self._failures.pop(key, None)
        if key in self._again:
            self._again.discard(key)
            self.add(key)

    async def drain(self, worker: Callable[[Key], Awaitable[bool]]) -> None:
        """Runs ``worker`` on keys forever; it returns False when the key should be retried later."""
        while True:
            key = await self.get()
            ok = False
            try:
                ok = await worker(key)
            finally:
                self.done(key, failed=not ok)


def backoff(attempts: int, base: float = 1.0, cap: float = 60.0) -> float:
    """Seconds before retry number ``attempts`` of a failed reconcile: 1, 2, 4, ... up to a minute."""
    return float(min(cap, base * 2 ** (attempts - 1)))
