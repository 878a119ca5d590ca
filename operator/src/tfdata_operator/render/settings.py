"""What every render function takes besides the spec: the operator-wide settings and the counts the plan decided.

``plan.children.CHILDREN`` calls one render function per child kind with a ``ServiceSpec``,
these ``BuildSettings`` and these ``Counts``; each returns its children as ``Named`` pairs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfdata_operator import __version__

DEFAULT_INJECTOR_IMAGE = f"tfdata-operator:{__version__}"

Manifest = dict[str, Any]
# A child by name: its manifest, or None when this spec wants no such object (it is deleted).
Named = tuple[str, Manifest | None]


@dataclass(frozen=True)
class BuildSettings:
    """Operator-wide settings the manifests depend on."""

    cluster_domain: str = "cluster.local"
    # Where the operator's own requests come from (its namespace and pod labels), for the rule of
    # each NetworkPolicy that lets it read the dispatcher's signals (spec.autoscaling.metric TFData).
    # None when it runs outside the cluster: its requests then come from a node, which every
    # NetworkPolicy admits anyway.
    operator_namespace: str | None = None
    operator_pod_labels: tuple[tuple[str, str], ...] = ()
    # The image whose init container copies the server program into pods of an image of the
    # user's (spec.serverProgram Injected): the operator's own, which holds the same program.
    injector_image: str = DEFAULT_INJECTOR_IMAGE


@dataclass(frozen=True)
class Counts:
    """What the plan decides before anything is rendered (``plan.scaling``).

    The length of a static dispatcher's worker list, the worker replicas (0 while suspended),
    and a static dispatcher's journal subdirectory (``journal.static_journal``).
    """

    dispatcher_workers: int
    worker_replicas: int
    journal: str | None = None
    # What the servers reported (status.server), which the client ConfigMap publishes.
    server: Mapping[str, Any] | None = None
    # The workers' PodDisruptionBudget (plan.drain): 0 while a client reads a static service.
    max_unavailable: int = 1
