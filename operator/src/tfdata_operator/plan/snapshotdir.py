"""One snapshot directory, one TFDataService (``spec.snapshots.directory``).

Two services whose snapshot directories are one place, or one inside the other, share their
snapshots: either's clients may delete the other's through their own dispatcher, and a
TFDataSnapshot of one may name the other's data. So one of them keeps the directory
(``DirectoryClaim.rank``): the one whose children already run with it (its ``<name>-client``
ConfigMap publishes it), else the one created first, else the first name. Each other one is
refused (``reasons.SNAPSHOT_DIRECTORY_TAKEN``): nothing of it is created or changed, and what it has
runs on as it is, until the directory is its own.

Which directories are one place: URLs (``gs://``, ``s3://``, ...) anywhere in the cluster; local
paths only in one namespace (a claim is a namespace's own, and no other mount can be seen), and
not when each service mounts a claim of its own there (``spec.snapshots.volume``).

Pure: the controller gathers the other services' directories from its cache (``controller/handlers.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tfdata_operator.api.paths import place, relation
from tfdata_operator.wire import discovery

__all__ = ["DirectoryClaim", "Taken", "claim_of", "place", "published", "relation", "root", "shares", "taken"]


@dataclass(frozen=True)
class DirectoryClaim:
    """A TFDataService's hold on its snapshot directory, as the cache has it."""

    namespace: str
    name: str
    directory: str  # spec.snapshots.directory as written
    volume: str | None  # spec.snapshots.volume.claimName
    created: str  # metadata.creationTimestamp (RFC 3339 in UTC: ordered as text)
    # The directory its children publish (the <name>-client ConfigMap's TFDATA_SNAPSHOT_DIR), if any.
    published: str | None = None

    @property
    def in_use(self) -> bool:
        return self.published is not None and place(self.published) == place(self.directory)

    def rank(self) -> tuple[bool, str, str, str]:
        return (not self.in_use, self.created, self.name, self.namespace)


def claim_of(body: Mapping[str, Any], client: Mapping[str, Any] | None = None) -> DirectoryClaim | None:
    """A TFDataService's claim from its body as written (None: no ``spec.snapshots.directory``), and
    its ``<name>-client`` ConfigMap (what its children use)."""
    snapshots = (body.get("spec") or {}).get("snapshots")
    if not isinstance(snapshots, Mapping):
        return None
    directory = snapshots.get("directory")
    if not isinstance(directory, str) or not directory:
        return None
    volume = snapshots.get("volume")
    claim = volume.get("claimName") if isinstance(volume, Mapping) else None
    meta = body.get("metadata") or {}
    return DirectoryClaim(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        directory=directory,
        volume=claim if isinstance(claim, str) else None,
        created=str(meta.get("creationTimestamp") or ""),
        published=published(client),
    )


def published(client: Mapping[str, Any] | None) -> str | None:
    """The snapshot directory a service's children use, as its ``<name>-client`` ConfigMap publishes it."""
    found = ((client or {}).get("data") or {}).get(discovery.KEYS["snapshot_dir"])
    return found if isinstance(found, str) else None


@dataclass(frozen=True)
class Taken:
    """Why a service may not use its snapshot directory: ``holder`` keeps it."""

    holder: DirectoryClaim
    message: str


def root(directory: str) -> tuple[str, str]:
    """Where a directory is looked for: its scheme and its first name (a bucket; "" for ``/`` or ``gs://``).
    Two directories nested or equal have one root, or one of them has an empty first name."""
    scheme, segments = place(directory)
    return scheme, segments[0] if segments else ""


def shares(mine: DirectoryClaim, other: DirectoryClaim) -> bool:
    """Whether the two directories are one place or nested, where both can be the same storage."""
    if (mine.namespace, mine.name) == (other.namespace, other.name) or relation(
        mine.directory, other.directory
    ) is None:
        return False
    if place(mine.directory)[0]:
        return True  # a URL names the same store from every namespace
    if mine.namespace != other.namespace:
        return False
    return mine.volume is None or other.volume is None or mine.volume == other.volume


def taken(mine: DirectoryClaim, others: Iterable[DirectoryClaim]) -> Taken | None:
    """None when ``mine`` may use its directory; else which service keeps it, and a message to act on.
    Another namespace's service is not named: its name is not this namespace's to know."""
    ahead = [o for o in others if shares(mine, o) and o.rank() < mine.rank()]
    if not ahead:
        return None
    holder = min(ahead, key=DirectoryClaim.rank)
    how = relation(mine.directory, holder.directory)
    if holder.namespace == mine.namespace:
        whose = f"TFDataService {holder.name}'s snapshot directory {holder.directory}"
        until = f"{holder.name} is deleted or its spec.snapshots.directory moves apart"
    else:
        whose = "the snapshot directory of another namespace's TFDataService"
        until = "that one is deleted or its directory moves apart"
    why = "its pods already use it" if holder.in_use else "created before this one"
    if holder.namespace == mine.namespace and not holder.in_use:
        why = f"created first, {holder.created}"
    return Taken(
        holder,
        f"spec.snapshots.directory {mine.directory} is {how} {whose} ({why}): two services must not share "
        "snapshots, as either's clients could delete the other's. Nothing of this service is created or "
        "changed, and what runs runs on as it is, until the directory is its own: give spec.snapshots.directory "
        f"a directory apart from it, or remove spec.snapshots. It proceeds by itself once {until}",
    )
