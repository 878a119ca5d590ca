"""The first steps: the spec parsed and checked (``InvalidSpec``), and ``spec.snapshots.directory``
not kept by another service (``SnapshotDirectoryTaken``). Either refusal changes nothing and says why.
"""

from __future__ import annotations

from tfdata_operator.api import reasons, spec
from tfdata_operator.controller.run import Run
from tfdata_operator.plan import snapshotdir
from tfdata_operator.render import builders


def validate(run: Run) -> bool:
    """The spec parsed, defaulted and checked; an invalid one changes nothing and says why."""
    try:
        run.svc = spec.parse(run.body, run.config.server_image, allow_host_path=run.config.allow_host_path)
    except spec.SpecError as exc:
        run.report.refused(None, f"Invalid spec: {exc}")
        return False
    return True


def claim_snapshot_directory(run: Run) -> bool:
    """A ``spec.snapshots.directory`` another service keeps (``plan.snapshotdir``) changes nothing and says whose."""
    if run.svc.snapshots is None:
        return True
    client = run.children.objects.get(("ConfigMap", builders.client_configmap_name(run.svc)))
    mine = snapshotdir.claim_of(run.body, client)
    if mine is not None and (taken := snapshotdir.taken(mine, run.observed.directories)):
        run.report.refused(run.svc, taken.message, reason=reasons.SNAPSHOT_DIRECTORY_TAKEN)
        return False
    return True
