"""The few minutes of readings the TFData autoscaler keeps.

``Windows`` keeps, per service, the recent readings (``controller.probes.fetch`` reads them
from the dispatcher) and what ``policy.decide`` remembers between decisions; one instance
lives in the operator's memo. Pure: no I/O.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field, replace

from tfdata_operator.autoscaling import policy as autoscaler
from tfdata_operator.autoscaling.policy import History, Policy, Sample, ScaleDecision
from tfdata_operator.wire.signals import ServiceSignals

# Per service, whatever the window: at one reading every 5 s, over an hour.
MAX_SAMPLES = 800


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
    ) -> ScaleDecision:
        """Records ``fetched`` (read at ``now``), decides, and remembers what the decision needs next time."""
        window = self.record(key, now, fetched, policy)
        decision = autoscaler.decide(policy, current, list(window.samples), window.history, now)
        window.history = decision.history
        window.next_at = now + decision.next_check_seconds
        if window.last_error is not None and not decision.scales:
            decision = replace(decision, reason=f"{decision.reason}; the last read failed: {window.last_error}")
        return decision
