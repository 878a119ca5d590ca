"""The TFDataSnapshot resource as the operator reads it: which service writes it, under what name,
and what deleting it does to its files.

The CRD (crds/tfdata.dev_tfdatasnapshots.yaml) refuses what it can; ``parse`` says the same for
an object the API server took before a rule existed. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfdata_operator.api.spec import SnapshotsSpec, SpecError
from tfdata_operator.wire.snapshots import MAX_NAME_LENGTH, SNAPSHOT_NAME

RETAIN, DELETE = "Retain", "Delete"
DELETION_POLICIES = (RETAIN, DELETE)
_SERVICE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_SERVICE_LENGTH = 41


@dataclass(frozen=True)
class SnapshotSpec:
    namespace: str
    name: str  # metadata.name
    service: str
    snapshot_name: str  # spec.snapshotName, else metadata.name: the last part of the path
    deletion_policy: str = RETAIN
    created: str = ""  # metadata.creationTimestamp: of two that name one path, the earlier keeps it

    def path(self, snapshots: SnapshotsSpec) -> str:
        """Where the service's workers write it: ``<spec.snapshots.directory>/<snapshot name>``, as
        ``client.snapshots`` joins them."""
        return f"{snapshots.directory.rstrip('/')}/{self.snapshot_name}"


def snapshot_name(body: Mapping[str, Any]) -> object:
    """The last part of the path as written (``spec.snapshotName``, else ``metadata.name``), unchecked."""
    spec = body.get("spec")
    return spec.get("snapshotName", (body.get("metadata") or {}).get("name")) if isinstance(spec, Mapping) else None


def parse(body: Mapping[str, Any]) -> SnapshotSpec:
    meta, spec = body.get("metadata") or {}, body.get("spec")
    problems: list[str] = []
    if not isinstance(spec, Mapping):
        raise SpecError(["spec is required: at least spec.service, the TFDataService that writes the snapshot"])
    service = spec.get("service")
    if not isinstance(service, str) or len(service) > MAX_SERVICE_LENGTH or not _SERVICE.match(service):
        problems.append(f"spec.service must name a TFDataService in this namespace, got {service!r}")
    name = snapshot_name(body)
    if not isinstance(name, str) or len(name) > MAX_NAME_LENGTH or not SNAPSHOT_NAME.fullmatch(name):
        problems.append(
            f"spec.snapshotName must be letters, digits, '.', '_' or '-' (at most {MAX_NAME_LENGTH}), "
            f"not starting with '.' or '-', got {name!r}"
        )
    policy = spec.get("deletionPolicy", RETAIN)
    if policy not in DELETION_POLICIES:
        problems.append(f"spec.deletionPolicy must be Retain or Delete, got {policy!r}")
    if problems or not isinstance(service, str) or not isinstance(name, str):
        raise SpecError(problems)
    created = str(meta.get("creationTimestamp") or "")
    return SnapshotSpec(meta.get("namespace") or "", meta.get("name") or "", service, name, policy, created)
