"""The settings of one operator process (from ``tfdata-operator run``'s options)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tfdata_operator.controller.election import ElectionConfig
from tfdata_operator.render.builders import BuildSettings


@dataclass(frozen=True)
class OperatorConfig:
    server_image: str | None = None
    build: BuildSettings = field(default_factory=BuildSettings)
    # Empty means every namespace.
    namespaces: tuple[str, ...] = ()
    # How often every TFDataService is queued for a reconcile even when nothing signals a change.
    # It reads nothing: the reconcile works from the watches' cache.
    resync_seconds: float = 60.0
    # How many reconciles run at once (each one service; one service is never reconciled twice at once).
    concurrent_reconciles: int = 8
    # Leader election on a Lease (several replicas: one reconciles, the others stand by); None: this
    # process reconciles from the start, as the only operator.
    election: ElectionConfig | None = None
