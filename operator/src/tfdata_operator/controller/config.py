"""The settings of one operator process (from ``tfdata-operator run``'s options)."""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass, field

from tfdata_operator.plan import drain
from tfdata_operator.render.builders import BuildSettings


@dataclass(frozen=True)
class OperatorConfig:
    server_image: str | None = None
    build: BuildSettings = field(default_factory=BuildSettings)
    # Empty means every namespace.
    namespaces: tuple[str, ...] = ()
    # --allow-host-path-volumes: hostPath volumes in spec.<component>.volumes (refused without it).
    allow_host_path: bool = False
    # --drain-max-wait-seconds: the longest any service's readers (or snapshot) hold a node's drain;
    # None: no bound (each service's rescaleMaxWaitSeconds only).
    drain_max_wait_seconds: int | None = drain.CLUSTER_MAX_WAIT_SECONDS
    # How often every TFDataService is queued for a reconcile even when nothing signals a change.
    # It reads nothing: the reconcile works from the watches' cache.
    resync_seconds: float = 60.0
    # How many reconciles run at once (each one service; one service is never reconciled twice at once).
    concurrent_reconciles: int = 8
    # --kueue: TFDataServices labelled kueue.x-k8s.io/queue-name are admitted through Kueue (the
    # operator watches Workloads); off, such a service runs no pod and says how to turn it on.
    kueue: bool = False
    # Leader election on a Lease (several replicas: one reconciles, the others stand by); None: this
    # process reconciles from the start, as the only operator.
    election: ElectionConfig | None = None


class ElectionError(ValueError):
    """A setting of the election that cannot work; the message says which and what to change."""


@dataclass(frozen=True)
class Timing:
    """client-go's three durations, in seconds. Its defaults (15, 10, 2) take 13-19 s to fail over
    after a leader dies without a clean exit; these take 8-14 s (the goal is 15)."""

    lease_duration: int = 10
    renew_deadline: float = 7.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        # client-go's own checks (leaderelection.NewLeaderElector), with its jitter factor of 1.2.
        if self.retry_period <= 0:
            raise ElectionError(f"the retry period must be above 0 s (is {self.retry_period})")
        if self.renew_deadline <= 1.2 * self.retry_period:
            raise ElectionError(
                f"the renew deadline ({self.renew_deadline} s) must be above 1.2 times the retry period "
                f"({self.retry_period} s): a leader must get more than one try to renew"
            )
        if self.lease_duration <= self.renew_deadline:
            raise ElectionError(
                f"the lease duration ({self.lease_duration} s) must be above the renew deadline "
                f"({self.renew_deadline} s): a leader that cannot renew must stop before a standby takes over"
            )


@dataclass(frozen=True)
class ElectionConfig:
    namespace: str
    name: str
    identity: str = field(default_factory=lambda: default_identity())
    timing: Timing = field(default_factory=Timing)


def default_identity() -> str:
    """The pod's name (a pod's hostname) and a suffix of its own: a restarted container is a new candidate."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
