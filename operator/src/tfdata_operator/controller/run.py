"""One reconcile of a TFDataService (``Run``): what it observed, and what each step decided for the next ones.

``Run.record`` is what every change does: a log line, the changes metric, an Event. Here too is what
the steps share: a read of an object the watches do not cover, kept a few seconds, and the arithmetic
of when to reconcile again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tfdata_operator.api import spec
from tfdata_operator.controller import metrics
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.interface import Api, Manifest, Observed, Outcome
from tfdata_operator.controller.readers import Dispatcher, Readers, retry_after
from tfdata_operator.controller.reporter import Reporter
from tfdata_operator.plan import desired as plan
from tfdata_operator.plan import drain, hold, nodeloss
from tfdata_operator.plan import kueue as queueing

log = logging.getLogger(__name__)


@dataclass
class Run:
    """One reconcile: what it observed, and what each step decided for the next ones."""

    api: Api
    config: OperatorConfig
    body: Manifest
    observed: Observed
    # How the service's pods are read (None: they are not: what they would say is unknown).
    readers: Readers | None
    children: plan.Children
    now: str
    outcome: Outcome = field(default_factory=Outcome)
    svc: spec.ServiceSpec = field(init=False)
    auto_status: Manifest | None = None
    decision: hold.HoldDecision = field(default_factory=lambda: hold.HoldDecision(hold.PROCEED))
    drains: drain.DrainDecision = field(default_factory=lambda: drain.DrainDecision(1))
    desired: plan.Desired = field(default_factory=lambda: plan.Desired([], [], None))
    # The children as they are after this reconcile's writes, by (kind, name).
    live: dict[tuple[str, str], Manifest] = field(default_factory=dict)
    # The children whose manifests differ from what runs, in the order they are applied.
    changed: list[Manifest] = field(default_factory=list)
    # Pods on unreachable nodes: what was done, and what each StatefulSet's condition says meanwhile.
    node_loss: nodeloss.NodeLoss = field(default_factory=nodeloss.NodeLoss)
    # status.lifecycle (spec.lifecycle), as follow_lifecycle decided it.
    lifecycle_status: Manifest | None = None
    # Kueue's turn (spec labels kueue.x-k8s.io/*), as follow_kueue decided it.
    kueue: queueing.Decision = field(default_factory=queueing.Decision)

    @property
    def report(self) -> Reporter:
        return Reporter(self.api, self.config, self.body, self.children, self.now, self.outcome)

    def record(self, reason: str, message: str, event_type: str = "Normal") -> None:
        """What every change does: a log line, the changes metric by reason, and an Event on the service."""
        meta = self.body["metadata"]
        log.info("%s/%s: %s", meta["namespace"], meta["name"], message)
        metrics.CHANGES.labels(reason).inc()
        self.api.event(self.body, event_type, reason, message)

    def dispatcher(self) -> Dispatcher:
        """The service's dispatcher, as ``readers`` asks it."""
        return Dispatcher(self.svc, self.config, self.children)


# How long a read of a Node, claim or volume is kept: a lost node is acted on at most this late,
# and the pods of one node (or a burst of their events) cost one read.
NODE_READ_SECONDS = 5.0


def read_kept(
    api: Api, readers: Readers | None, api_version: str, kind: str, namespace: str | None, name: str
) -> Manifest | None:
    """An object the watches do not cover (None: it does not exist), kept for NODE_READ_SECONDS."""
    if readers is None:
        return api.get(api_version, kind, namespace, name)
    key = (kind, namespace, name)
    return readers.nodes.get(
        key, lambda: api.get(api_version, kind, namespace, name), readers.clock(), NODE_READ_SECONDS
    )


def later(a: float, b: float | None) -> float:
    """The later of a requeue delay and a pod's back-off (None: none)."""
    return a if b is None else max(a, b)


def no_sooner(requeue: float | None, *answers: object) -> float | None:
    """A decision's requeue delay, no sooner than the answers that were not asked may be asked
    (``readers.retry_after``): a pod backed off is not polled by the reconciles it holds up."""
    again = retry_after(*answers)
    return again if requeue is None else later(requeue, again)


def sooner(a: float | None, b: float | None) -> float | None:
    """The earlier of two requeue delays (None: no requeue asked)."""
    return b if a is None else a if b is None else min(a, b)
