"""``spec.snapshots``: where tf.data distributed snapshots go, and the claim mounted there.

Whether the dispatcher's journal lies inside the snapshot directory needs the dispatcher too:
``spec/checks.py`` checks that.
"""

from __future__ import annotations

from tfdata_operator.api import paths
from tfdata_operator.api.spec.reader import DNS_SUBDOMAIN, Reader
from tfdata_operator.api.spec.types import JOURNAL_MOUNT, MAX_SNAPSHOT_DIR_LENGTH, TMP_MOUNT, SnapshotsSpec
from tfdata_operator.wire import serverconfig

# spec.snapshots.directory: an absolute path, or a URL of any filesystem the server image has
# (TensorFlow 2.21 registers file:// and gs://; an image with tensorflow-io adds s3:// and others).
_SNAPSHOT_DIR = serverconfig.SNAPSHOT_DIR


def parse_snapshots(r: Reader, program: bool = False) -> SnapshotsSpec | None:
    """``program``: the injected server program's volume is mounted (spec.serverProgram not FromImage)."""
    directory = r.string("directory", None, max_length=MAX_SNAPSHOT_DIR_LENGTH)
    volume = r.child("volume")
    claim = volume.string("claimName", pattern=DNS_SUBDOMAIN) if r.has("volume") else None
    volume.finish()
    r.finish()
    if directory is None:
        if not r.has("directory"):
            r.problems.append(f"{r.path}.directory is required: where the snapshots go (gs://bucket/path or /path)")
        return None
    if not _SNAPSHOT_DIR.fullmatch(directory):
        r.problems.append(
            f"{r.path}.directory must be an absolute path or a URL such as gs://bucket/path, got {directory!r}"
        )
        return None
    if r.has("volume") and claim is None and not volume.has("claimName"):
        r.problems.append(f"{r.path}.volume.claimName is required: the ReadWriteMany claim to mount at the directory")
    if claim is not None and not directory.startswith("/"):
        r.problems.append(
            f"{r.path}.volume is mounted at {r.path}.directory, so the directory must be an absolute path, "
            f"got {directory!r}: remove the volume to write to a URL, or give a path such as /snapshots"
        )
        return None
    if claim is not None and (directory.rstrip("/") or "/") in ("/", TMP_MOUNT, JOURNAL_MOUNT):
        r.problems.append(
            f"{r.path}.directory must not be {directory} when a volume is mounted there: the pods need it "
            "for themselves. Use another path, such as /snapshots"
        )
        return None
    if claim is not None and program and paths.relation(directory, serverconfig.INJECT_MOUNT) is not None:
        r.problems.append(
            f"{r.path}.directory must not be {serverconfig.INJECT_MOUNT}, under it or above it when a volume is "
            f"mounted there (got {directory}): the operator mounts the injected server program at "
            f"{serverconfig.INJECT_MOUNT} (spec.serverProgram Injected, or Auto). Use another path, such as "
            "/snapshots, or set spec.serverProgram: FromImage if the image has tfdata-server"
        )
        return None
    return SnapshotsSpec(directory=directory, claim_name=claim)
