"""One snapshot directory, one TFDataService (plan/snapshotdir.py): which directories are one place,
which service keeps it, and what the refused one is told."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tfdata_operator.controller import cache, handlers
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.state import OperatorState
from tfdata_operator.controller.workqueue import WorkQueue
from tfdata_operator.plan import children, snapshotdir
from tfdata_operator.plan.snapshotdir import DirectoryClaim

from fixtures.fakes import FakeApi, service

T0, T1 = "2026-11-28T10:00:00Z", "2026-11-28T11:00:00Z"


def claim(
    name: str,
    directory: str,
    created: str = T0,
    namespace: str = "ml",
    volume: str | None = None,
    published: str | None = None,
) -> DirectoryClaim:
    return DirectoryClaim(namespace, name, directory, volume, created, published)


@pytest.mark.parametrize(
    ("mine", "other", "how"),
    [
        ("gs://bucket/a", "gs://bucket/a", "the same as"),
        ("gs://bucket/a/", "gs://bucket/a", "the same as"),
        ("gs://bucket/a", "gs://bucket//a/./", "the same as"),
        ("GS://bucket/a", "gs://bucket/a", "the same as"),
        ("gs://bucket/a/x", "gs://bucket/a", "inside"),
        ("gs://bucket/a", "gs://bucket/a/x/y", "contains"),
        ("gs://bucket/a/../b", "gs://bucket/b", "the same as"),
        ("/snaps/a", "/snaps/a/", "the same as"),
        ("file:///snaps/a", "/snaps/a", "the same as"),
        ("/snaps/./a/b", "/snaps/a", "inside"),
        ("/snaps", "/snaps/a", "contains"),
        # The same prefix is not a parent: /a/bc is not inside /a/b.
        ("/a/bc", "/a/b", None),
        ("gs://bucket/a/bc", "gs://bucket/a/b", None),
        ("gs://bucket/a", "gs://other/a", None),
        ("gs://bucketa", "gs://bucket", None),
        ("s3://bucket/a", "gs://bucket/a", None),
        ("/bucket/a", "gs://bucket/a", None),
    ],
)
def test_how_two_directories_lie(mine: str, other: str, how: str | None) -> None:
    assert snapshotdir.relation(mine, other) == how


def test_the_one_created_later_is_refused_naming_the_first_and_its_directory() -> None:
    first, second = claim("first", "gs://b/snaps", T0), claim("second", "gs://b/snaps/", T1)
    assert snapshotdir.taken(first, [second]) is None
    taken = snapshotdir.taken(second, [first])
    assert taken is not None and taken.holder == first
    assert taken.message.startswith(
        "spec.snapshots.directory gs://b/snaps/ is the same as TFDataService first's snapshot directory gs://b/snaps "
        f"(created first, {T0})"
    )
    assert "It proceeds by itself once first is deleted or its spec.snapshots.directory moves apart" in taken.message


@pytest.mark.parametrize(
    ("later", "how"), [("gs://b/snaps/team", "inside"), ("gs://b", "contains"), ("gs://b/snaps", "the same as")]
)
def test_nested_either_way_is_refused(later: str, how: str) -> None:
    taken = snapshotdir.taken(claim("second", later, T1), [claim("first", "gs://b/snaps", T0)])
    assert taken is not None and f"{later} is {how} TFDataService first's" in taken.message


def test_apart_directories_are_both_kept() -> None:
    mine = claim("second", "gs://b/a/bc", T1)
    assert snapshotdir.taken(mine, [claim("x", "gs://b/a/b"), claim("y", "gs://c/a/bc"), claim("z", "/a/bc")]) is None


def test_a_tie_in_time_goes_to_the_first_name() -> None:
    a, b = claim("a", "gs://b/s", T0), claim("b", "gs://b/s", T0)
    assert snapshotdir.taken(a, [b]) is None
    assert (taken := snapshotdir.taken(b, [a])) is not None and taken.holder == a


def test_of_many_the_earliest_holder_is_named() -> None:
    mine = claim("mine", "gs://b/s/x", "2026-11-28T12:00:00Z")
    others = [
        claim("later", "gs://b/s", T1),
        claim("earliest", "gs://b", T0),
        claim("after", "gs://b/s/x", "2026-11-29"),
    ]
    assert (taken := snapshotdir.taken(mine, others)) is not None and taken.holder.name == "earliest"


def test_one_whose_pods_already_use_the_directory_keeps_it_against_an_older_one_edited_onto_it() -> None:
    # The older service's directory was edited onto the younger's, whose pods already write there:
    # the older one is held (its pods keep their old directory), the younger goes on.
    older = claim("older", "gs://b/young", T0, published="gs://b/old")
    younger = claim("younger", "gs://b/young/", T1, published="gs://b/young")
    assert snapshotdir.taken(younger, [older]) is None
    taken = snapshotdir.taken(older, [younger])
    assert taken is not None and taken.holder == younger and "(its pods already use it)" in taken.message


def test_another_namespaces_service_is_not_named() -> None:
    theirs = claim("secret-project", "gs://shared/team", T0, namespace="tenant-b")
    taken = snapshotdir.taken(claim("mine", "gs://shared/team/mine", T1), [theirs])
    assert taken is not None
    for secret in ("secret-project", "tenant-b", "gs://shared/team ", T0):
        assert secret not in taken.message
    assert taken.message.startswith(
        "spec.snapshots.directory gs://shared/team/mine is inside the snapshot directory of another namespace's "
        "TFDataService (created before this one)"
    )
    assert "once that one is deleted or its directory moves apart" in taken.message


def test_local_paths_are_one_place_only_in_one_namespace_and_on_one_claim() -> None:
    mine = claim("second", "/snapshots", T1, volume="mine")
    # Another namespace's /snapshots is another claim or another disk.
    assert snapshotdir.taken(mine, [claim("first", "/snapshots", T0, namespace="other")]) is None
    # Each on a claim of its own: two places.
    assert snapshotdir.taken(mine, [claim("first", "/snapshots", T0, volume="theirs")]) is None
    # The same claim, or one of them without a claim (a volume of its own pods, which may be anything): one place.
    assert snapshotdir.taken(mine, [claim("first", "/snapshots/x", T0, volume="mine")]) is not None
    assert snapshotdir.taken(mine, [claim("first", "/snapshots", T0)]) is not None


@pytest.mark.parametrize(
    ("directory", "root"),
    [("gs://bucket/a/b", ("gs", "bucket")), ("gs://bucket/", ("gs", "bucket")), ("gs://", ("gs", "")),
     ("/data/a", ("", "data")), ("file:///data", ("", "data")), ("/", ("", ""))],
)  # fmt: skip
def test_a_directory_is_looked_for_under_its_root(directory: str, root: tuple[str, str]) -> None:
    assert snapshotdir.root(directory) == root


def test_a_service_is_never_its_own_rival() -> None:
    assert snapshotdir.taken(claim("a", "gs://b/s", T1), [claim("a", "gs://b/s", T0)]) is None


def test_the_claim_is_read_from_the_body_and_the_client_configmap() -> None:
    body = {
        "metadata": {"name": "a", "namespace": "ml", "creationTimestamp": T0},
        "spec": {"snapshots": {"directory": "/s", "volume": {"claimName": "c"}}},
    }
    client = {"data": {"TFDATA_SNAPSHOT_DIR": "/s"}}
    assert snapshotdir.claim_of(body, client) == DirectoryClaim("ml", "a", "/s", "c", T0, "/s")
    assert snapshotdir.claim_of({**body, "spec": {}}) is None
    assert snapshotdir.claim_of({**body, "spec": {"snapshots": "gs://b"}}) is None
    assert snapshotdir.claim_of(body).in_use is False  # type: ignore[union-attr]


# --- The operator's wiring (controller/handlers.py) on an in-memory cache ------------------------


def stored(name: str, directory: str, created: str) -> dict[str, Any]:
    body = service(snapshots={"directory": directory})
    body["metadata"] |= {"name": name, "creationTimestamp": created}
    return body


async def watched(memo: OperatorState, body: dict[str, Any], event: str = "ADDED") -> None:
    """What kopf does with a TFDataService's event: the indexes first, then the event handler."""
    key = ("ml", body["metadata"]["name"])
    memo.indices[handlers.SERVICES_INDEX].pop(key, None)
    directories = memo.indices[handlers.DIRECTORIES_INDEX]
    for root in list(directories):
        directories[root] = [c for c in directories[root] if (c.namespace, c.name) != key]
    if event != "DELETED":
        memo.indices[handlers.SERVICES_INDEX][key] = [cache.pack(body)]
        found = await handlers.index_snapshot_directory(body=body, namespace="ml", name=key[1])
        for root, claim in (found or {}).items():
            directories.setdefault(root, []).append(claim)
    await handlers.service_event(event={"type": event}, body=body, namespace="ml", name=key[1], memo=memo)


async def queued(memo: OperatorState) -> list[Any]:
    keys = []
    while len(memo.queue):
        keys.append(key := await asyncio.wait_for(memo.queue.get(), 5))
        memo.queue.done(key)
    return sorted(keys)


@pytest.mark.parametrize("first_goes", ["deleted", "moved"])
def test_the_later_service_is_refused_from_the_cache_and_queued_when_the_first_lets_go(first_goes: str) -> None:
    api = FakeApi()
    first, second = stored("first", "gs://b/snaps", T0), stored("second", "gs://b/snaps/", T1)

    async def scenario() -> list[Any]:
        memo = handlers.new_memo(OperatorConfig(server_image="tfdata-server:test"))
        memo.indices = {kind.index: {} for kind in children.OBSERVED}
        memo.indices |= {handlers.SERVICES_INDEX: {}, handlers.DIRECTORIES_INDEX: {}}
        memo.kube, memo.queue, memo.pool = api, WorkQueue(), ThreadPoolExecutor(max_workers=1)  # type: ignore[assignment]
        memo.indexed.set()
        memo.leading.set()
        for body in (first, second):
            await watched(memo, body)
        seen = [await queued(memo)]
        await handlers._reconcile(memo, ("ml", "second"))
        seen.append(api.take_calls())
        if first_goes == "deleted":
            await watched(memo, first, "DELETED")
        else:
            await watched(memo, stored("first", "gs://b/other", T0), "MODIFIED")
        seen.append(await queued(memo))
        await handlers._reconcile(memo, ("ml", "second"))
        seen.append([c for c in api.take_calls() if c[0] == "event"])
        # A service's own event that changes no directory queues no other one.
        await watched(memo, second, "MODIFIED")
        seen.append(await queued(memo))
        memo.pool.shutdown()
        return seen

    watch, refused, requeued, created, quiet = asyncio.run(scenario())
    assert watch == [("ml", "first"), ("ml", "second")]
    assert refused == [("event", "SnapshotDirectoryTaken"), ("status", "second")]
    assert requeued == [("ml", "first"), ("ml", "second")]  # its own event queues the first, as ever
    assert created == [("event", "Created")]
    assert quiet == [("ml", "second")]


@pytest.mark.parametrize(
    ("mine", "theirs", "found"),
    [
        ("gs://b/x/y", "gs://b", True),
        ("gs://b", "gs://b/x/y", True),
        ("gs://b/x", "gs://c/x", False),
        ("/data/x", "/", True),  # "/" contains every local path of the namespace
        ("/", "/data/x", True),
        ("/data/x", "/other", False),
    ],
)
def test_the_cache_finds_the_others_under_the_same_root_only(mine: str, theirs: str, found: bool) -> None:
    async def scenario() -> tuple[Any, ...]:
        memo = handlers.new_memo(OperatorConfig())
        memo.indices = {kind.index: {} for kind in children.OBSERVED}
        memo.indices |= {handlers.SERVICES_INDEX: {}, handlers.DIRECTORIES_INDEX: {}}
        memo.queue = WorkQueue()
        memo.indexed.set()
        for body in (stored("theirs", theirs, T0), stored("other-bucket", "gs://elsewhere/x", T0)):
            await watched(memo, body)
        return handlers.directory_claims(memo, ("ml", "mine"), stored("mine", mine, T1))

    claims = asyncio.run(scenario())
    assert [c.name for c in claims] == (["theirs"] if found else [])
