"""Where the TFData autoscaler's readings come from, and the few minutes of them it keeps.

``fetch`` reads one ``signals.ServiceSignals`` from a dispatcher pod's ``/v1/signals``: a
short timeout, a bounded body, and never an exception (a dispatcher that is down, restarting
or of another version is an ordinary moment, described in words). ``Windows`` keeps, per
service, the recent readings and what ``autoscaler.decide`` remembers between decisions; one
instance lives in the operator's memo. Neither needs the Kubernetes client.
"""

from __future__ import annotations

import http.client
import threading
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field, replace

from . import autoscaler
from .autoscaler import Decision, History, Policy, Sample
from .signals import ServiceSignals, SignalsError

# The dispatcher answers from memory (its poll of the workers runs apart): anything slower is a
# dispatcher in trouble, and the reconcile thread must not wait on it.
TIMEOUT_SECONDS = 2.0
# A ServiceSignals document is well under 1 KiB, plus one name per unreachable worker.
MAX_BYTES = 256 * 1024
# Per service, whatever the window: at one reading every 5 s, over an hour.
MAX_SAMPLES = 800

# Cluster-local addresses: never through an HTTP(S)_PROXY from the operator's environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str, timeout: float = TIMEOUT_SECONDS) -> ServiceSignals | str:
    """The dispatcher's signals, or why they could not be read."""
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            body = response.read(MAX_BYTES + 1)
            # A bounded read returns what came before the connection dropped, without an error:
            # what the Content-Length still promised says so.
            missing = getattr(response, "length", None)
    except urllib.error.HTTPError as exc:
        return f"GET {url} answered {exc.code} {exc.reason}"
    except urllib.error.URLError as exc:
        return f"GET {url} failed: {exc.reason}"
    except (OSError, http.client.HTTPException) as exc:  # timeouts, resets, a garbled answer
        return f"GET {url} failed: {type(exc).__name__}: {exc or 'no detail'}"
    if len(body) > MAX_BYTES:
        return f"GET {url} answered more than {MAX_BYTES} bytes: not a signals document"
    if missing:
        return f"GET {url} failed: the answer ended {missing} bytes short of its Content-Length"
    try:
        return ServiceSignals.from_json(body)
    except SignalsError as exc:
        return f"GET {url}: {exc}"


# A readiness detail is one line; more is not a detail.
MAX_READINESS_BYTES = 4096


def read_readiness(url: str, timeout: float = TIMEOUT_SECONDS) -> str | None:
    """What a server's ``/readyz`` says about itself (its 503 body: "not ok: running: ...; 2 of 3 workers
    registered: waiting for ..."), or None when it could not be asked (not there, not answering)."""
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            body = response.read(MAX_READINESS_BYTES)
    except urllib.error.HTTPError as exc:
        body = exc.read(MAX_READINESS_BYTES)
        exc.close()
    except (OSError, http.client.HTTPException):
        return None
    text = body.decode("utf-8", "replace").strip()
    return text or None


@dataclass
class ServiceWindow:
    """One service's recent readings, oldest first, and the decision's memory."""

    samples: deque[Sample] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    history: History = field(default_factory=History)
    last_error: str | None = None
    latest: ServiceSignals | None = None  # the whole last document, for the status
    next_at: float = float("-inf")  # when the last decision asked to be checked again


class Windows:
    """Every autoscaled service's window, by key (namespace, name).

    The work queue never reconciles one service twice at once, so one key's window is used by
    one thread at a time; the lock only guards the dictionary itself.
    """

    def __init__(self) -> None:
        self._windows: dict[Hashable, ServiceWindow] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._windows)

    def get(self, key: Hashable) -> ServiceWindow:
        with self._lock:
            return self._windows.setdefault(key, ServiceWindow())

    def due(self, key: Hashable, now: float) -> bool:
        """Whether the service's next check is due: reconciles that other events trigger in between
        neither read the dispatcher again nor crowd the window."""
        with self._lock:
            window = self._windows.get(key)
        return window is None or now >= window.next_at

    def forget(self, key: Hashable) -> None:
        """For a service deleted, or no longer autoscaled on TFData."""
        with self._lock:
            self._windows.pop(key, None)

    def record(self, key: Hashable, at: float, fetched: ServiceSignals | str, policy: Policy) -> ServiceWindow:
        """Adds one reading (or a failed one) and drops what no decision will look at again."""
        window = self.get(key)
        if isinstance(fetched, str):
            window.last_error = fetched
        else:
            window.last_error = None
            window.latest = fetched
            window.samples.append(Sample.of(at, fetched))
        keep = autoscaler.retention_seconds(policy)
        while window.samples and window.samples[0].at < at - keep:
            window.samples.popleft()
        return window

    def decide(
        self, key: Hashable, policy: Policy, current: int, fetched: ServiceSignals | str, now: float
    ) -> Decision:
        """Records ``fetched`` (read at ``now``), decides, and remembers what the decision needs next time."""
        window = self.record(key, now, fetched, policy)
        decision = autoscaler.decide(policy, current, list(window.samples), window.history, now)
        window.history = decision.history
        window.next_at = now + decision.next_check_seconds
        if window.last_error is not None and not decision.scales:
            decision = replace(decision, reason=f"{decision.reason}; the last read failed: {window.last_error}")
        return decision
