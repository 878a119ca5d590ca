"""How long the training loop waits for data: measured, added up and reported to the dispatcher pod.

The fraction of wall time spent waiting for the next element is the data-stall signal
(Cachew, ATC'22): near 0 when the input pipeline keeps up, near 1 when the trainer mostly
waits. ``StallReporter`` adds up the waits and sends them as a ``signals.ClientReport`` to the
dispatcher pod every ``interval`` seconds from a background thread, and once with ``done:
true`` when the loop ends. ``StallMeter`` is the iterator wrapper that times each ``next()``
(``iterate``); ``client.fit`` measures a Keras fit with the same reporter. Reporting never
breaks or slows training: a failed report is logged once and dropped. Standard library only.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Generic, TypeVar

from tfdata_operator.wire import signals

T = TypeVar("T")
log = logging.getLogger("tfdata_operator.client")
REPORT_TIMEOUT_SECONDS = 2.0
# How often a reporter sends: the wire's 5 s, so that the dispatcher, which forgets a trainer after 15 s
# without a report (``client_report_timeout_ms``), forgets a live one only after two reports in a row are lost.
INTERVAL_SECONDS = signals.REPORT_EVERY_SECONDS


def new_client_id() -> str:
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:80] or "host"
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def post_report(url: str, report: signals.ClientReport, timeout: float = REPORT_TIMEOUT_SECONDS) -> None:
    request = urllib.request.Request(
        url, data=report.to_json().encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        response.read()


class StallReporter:
    """Adds up waits over windows and reports them to ``report_url`` (if given) every ``interval`` seconds.

    What waits is measured elsewhere: handed to ``add`` by ``StallMeter`` around each ``next()``,
    or read from ``poll``, running totals that the reporter reads when it reports (the counters
    of the stage ``distribute()`` appends, ``client.fit``) and of which it counts what was added
    since it was made.
    ``close()`` sends the final report (``done: true``). With ``quiet_until_first``, no periodic
    report goes out before the first element: a meter that has seen nothing has measured nothing,
    and a stall fraction of 0 would tell the autoscaler the data keeps up.
    """

    def __init__(
        self,
        report_url: str | None,
        job_name: str | None = None,
        interval: float = INTERVAL_SECONDS,
        client_id: str | None = None,
        send: Callable[[str, signals.ClientReport], None] = post_report,
        clock: Callable[[], float] = time.monotonic,
        quiet_until_first: bool = False,
        poll: Callable[[], tuple[float, int]] | None = None,
    ) -> None:
        self.report_url = report_url
        self.job_name = job_name
        self.client_id = client_id or new_client_id()
        self._send = send
        self._clock = clock
        self._quiet_until_first = quiet_until_first
        self._lock = threading.Lock()
        self._window_start = clock()
        self._waited = 0.0
        self._elements = 0
        self.total_waited = 0.0
        self.total_elements = 0
        self._started = clock()
        self._closed = False
        self._warned = False
        self._poll = poll
        self._polled = poll() if poll else (0.0, 0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if report_url:
            self._thread = threading.Thread(
                target=self._report_every, args=(interval,), name="stall-report", daemon=True
            )
            self._thread.start()

    def add(self, waited: float, elements: int) -> None:
        """``elements`` arrived after the loop waited ``waited`` seconds for them."""
        with self._lock:
            self._waited += waited
            self._elements += elements
            self.total_waited += waited
            self.total_elements += elements

    def poll(self) -> None:
        """Adds what ``poll`` counted since it was last read (at once when made: earlier counts are not ours)."""
        if self._poll is None:
            return
        try:
            now = self._poll()
        except Exception as exc:  # never let reporting break training (e.g. TensorFlow shutting down)
            log.debug("cannot read the data-stall counters (%s)", exc)
            return
        with self._lock:
            (waited, elements), (was_waited, was_elements) = now, self._polled
            self._polled = now
        self.add(waited - was_waited, elements - was_elements)

    @property
    def stall_fraction(self) -> float:
        """Over the whole run so far."""
        wall = self._clock() - self._started
        return min(1.0, self.total_waited / wall) if wall > 0 else 0.0

    def take_report(self, done: bool = False) -> signals.ClientReport:
        """The report for the window since the last one, which starts a new window."""
        with self._lock:
            now = self._clock()
            window = max(0.0, now - self._window_start)
            fraction = min(1.0, self._waited / window) if window > 0 else 0.0
            report = signals.ClientReport(
                client_id=self.client_id,
                stall_fraction=fraction,
                window_seconds=window,
                elements=self._elements,
                job_name=self.job_name,
                done=done,
            )
            self._window_start, self._waited, self._elements = now, 0.0, 0
        return report

    def _report(self, done: bool) -> None:
        if not self.report_url:
            return
        self.poll()
        if self._quiet_until_first and not done and not self.total_elements:
            return
        report = self.take_report(done)
        try:
            self._send(self.report_url, report)
        except Exception as exc:  # never let reporting break training
            if not self._warned:
                self._warned = True
                log.warning("cannot send the data-stall report to %s (%s); training goes on", self.report_url, exc)

    def _report_every(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._report(done=False)

    def close(self) -> None:
        """Ends the measurement and sends the final report (``done: true``); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=REPORT_TIMEOUT_SECONDS + 1)
        self.poll()  # also without a report_url, for total_elements and stall_fraction
        self._report(done=True)


class StallMeter(StallReporter, Generic[T]):
    """Iterates ``iterable``, timing each ``next()``; reports to ``report_url`` if one is given.

    Use it as the training loop's iterator (``for batch in meter``), or as a context manager
    so that an early ``break`` still sends the final report.
    """

    def __init__(
        self,
        iterable: Iterable[T],
        report_url: str | None,
        job_name: str | None = None,
        interval: float = INTERVAL_SECONDS,
        client_id: str | None = None,
        translate: Callable[[Exception], Exception | None] | None = None,
        send: Callable[[str, signals.ClientReport], None] = post_report,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._it: Iterator[T] = iter(iterable)
        self._translate = translate
        super().__init__(report_url, job_name, interval, client_id, send, clock)

    def __iter__(self) -> StallMeter[T]:
        return self

    def __next__(self) -> T:
        began = self._clock()
        try:
            item = next(self._it)
        except StopIteration:
            self.add(self._clock() - began, 0)
            self.close()
            raise
        except Exception as exc:
            self.add(self._clock() - began, 0)
            self.close()
            better = self._translate(exc) if self._translate else None
            if better is not None:
                raise better from exc
            raise
        self.add(self._clock() - began, 1)
        return item

    def __enter__(self) -> StallMeter[T]:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
