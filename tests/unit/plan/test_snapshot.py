"""The TFDataSnapshot resource: its spec, the status from the dispatcher's answers, and its deletion
(plan/snapshot.py, plan/snapshotdeletion.py), and the controller's reads and writes around them
(controller/snapshots.py)."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tfdata_operator.api import snapshot as snapshotapi
from tfdata_operator.api.identity import SNAPSHOT_FINALIZER
from tfdata_operator.api.spec import SpecError
from tfdata_operator.controller import cache, handlers, probes
from tfdata_operator.controller import snapshots as controller
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.readers import SnapshotReaders
from tfdata_operator.controller.state import OperatorState
from tfdata_operator.controller.workqueue import WorkQueue
from tfdata_operator.plan import children, snapshotdeletion
from tfdata_operator.plan import snapshot as plansnap
from tfdata_operator.plan.desired import Children
from tfdata_operator.server import health, probestate
from tfdata_operator.server import snapshots as snapshot_server
from tfdata_operator.server.journal import LocalFileSystem
from tfdata_operator.server.snapshots import SnapshotReader
from tfdata_operator.wire import snapshots as wire
from tfdata_operator.wire.snapshots import SnapshotProgress, SnapshotsReport

from fixtures.cases import SNAPSHOT_CRD_PATH, beyond_crd, status_schema
from fixtures.cases import body as service_body
from fixtures.fakes import Clock
from fixtures.manifests import API_VERSION

NOW = datetime(2026, 11, 27, 12, 0, 0, tzinfo=timezone.utc)
DIRECTORY = "gs://bucket/snaps"
PATH = f"{DIRECTORY}/imagenet-v3"


def snapshot_body(deletion: str | None = None, status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "TFDataSnapshot",
        "metadata": {"name": "imagenet-v3", "namespace": "ml", "generation": 1, "resourceVersion": "7", "uid": "u1"},
        "spec": {"service": "demo", **spec},
    }
    if deletion:
        body["spec"]["deletionPolicy"] = deletion
    if status is not None:
        body["status"] = status
    return body


def snap(**spec: Any) -> snapshotapi.SnapshotSpec:
    return snapshotapi.parse(snapshot_body(**spec))


def with_snapshots(directory: str = DIRECTORY, **extra: Any) -> dict[str, Any]:
    return service_body(
        shardingPolicy="DYNAMIC", image="tfdata-server:test", snapshots={"directory": directory}, **extra
    )


def progress(state: str, journaled: bool = True, started_ago: float = 5.0, **counts: Any) -> SnapshotProgress:
    started = NOW.timestamp() - started_ago
    finished = NOW.timestamp() if state in wire.FINAL_STATES else None
    return SnapshotProgress(PATH, state, journaled, started_at=started, finished_at=finished, **counts)


# --- The spec ------------------------------------------------------------------------------


def test_the_name_defaults_to_the_objects_and_the_path_joins_the_services_directory() -> None:
    assert snap().snapshot_name == "imagenet-v3"
    assert snap(snapshotName="imagenet_v3.2").snapshot_name == "imagenet_v3.2"
    assert snap().deletion_policy == snapshotapi.RETAIN
    target = plansnap.target(snap(), with_snapshots(), None)
    assert target.path == PATH


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"service": "Demo"}, "spec.service must name a TFDataService"),
        ({"snapshotName": "../up"}, "spec.snapshotName must be letters"),
        ({"snapshotName": ".hidden"}, "spec.snapshotName must be letters"),
        ({"deletionPolicy": "Purge"}, "spec.deletionPolicy must be Retain or Delete"),
    ],
)
def test_a_bad_spec_says_what_to_fix(spec: dict[str, Any], said: str) -> None:
    with pytest.raises(SpecError, match=said):
        snapshotapi.parse(snapshot_body(**spec))


def test_a_service_that_cannot_take_a_snapshot_says_why() -> None:
    missing = plansnap.target(snap(), None, None)
    assert (missing.path, missing.reason, missing.exists) == (None, plansnap.SERVICE_NOT_FOUND, False)
    plain = plansnap.target(snap(), service_body(shardingPolicy="DYNAMIC", image="tfdata-server:test"), None)
    assert plain.reason == plansnap.NO_SNAPSHOT_STORAGE and "spec.snapshots.directory" in plain.message
    invalid = plansnap.target(snap(), service_body(shardingPolicy="SOMETIMES"), None)
    assert invalid.reason == plansnap.INVALID_SERVICE and "shardingPolicy" in invalid.message


# --- The status ----------------------------------------------------------------------------


def observe(reading: plansnap.Reading | None, old: dict[str, Any] | None = None) -> plansnap.Observation:
    return plansnap.observe(snap(), plansnap.Target(PATH), reading, old or {}, NOW)


def test_nothing_at_the_path_waits_for_a_trainer_and_says_the_call() -> None:
    seen = observe(progress(wire.MISSING))
    assert seen.status["state"] == plansnap.TRIGGER_PENDING
    assert seen.status["reason"] == plansnap.WAITING_FOR_SAVE
    assert "snapshots.save(dataset, 'imagenet-v3', 'demo')" in seen.status["message"]
    assert seen.requeue_after == plansnap.POLL_SECONDS and seen.events == ()


def test_the_states_follow_the_files_with_progress_and_one_event_per_change() -> None:
    writing = observe(progress(wire.IN_PROGRESS, streams_total=2, streams_done=1, chunks=3, elements=90, bytes=900))
    assert writing.status | {"message": ""} == {
        "state": plansnap.IN_PROGRESS,
        "reason": plansnap.WRITING,
        "message": "",
        "path": PATH,
        "streams": "1/2",
        "streamsDone": 1,
        "streamsTotal": 2,
        "chunks": 3,
        "elements": 90,
        "bytes": 900,
        "startedAt": "2026-11-27T11:59:55Z",
    }
    assert [e[1] for e in writing.events] == ["SnapshotStarted"]
    again = observe(progress(wire.IN_PROGRESS, streams_total=2, streams_done=2, chunks=4), writing.status)
    assert again.events == () and again.status["streams"] == "2/2"
    done = observe(progress(wire.COMPLETED, streams_total=2, streams_done=2, elements=120), again.status)
    assert done.status["state"] == plansnap.COMPLETED and done.requeue_after is None
    assert done.status["finishedAt"] == "2026-11-27T12:00:00Z"
    assert f"Dataset.load({PATH!r})" in done.status["message"]
    assert [(e[0], e[1]) for e in done.events] == [("Normal", "SnapshotCompleted")]


def test_a_failed_snapshot_carries_tensorflows_error_and_warns() -> None:
    failed = observe(progress(wire.FAILED, error="INVALID_ARGUMENT: bad element"), {"state": plansnap.IN_PROGRESS})
    assert failed.status["state"] == plansnap.FAILED and failed.status["error"] == "INVALID_ARGUMENT: bad element"
    assert [(e[0], e[1]) for e in failed.events] == [("Warning", "SnapshotFailed")]


def test_a_snapshot_nobody_journals_is_abandoned_only_after_a_grace() -> None:
    fresh = observe(progress(wire.IN_PROGRESS, journaled=False, started_ago=5))
    assert fresh.status["state"] == plansnap.IN_PROGRESS
    old = observe(progress(wire.IN_PROGRESS, journaled=False, started_ago=plansnap.UNJOURNALED_GRACE_SECONDS))
    assert (old.status["state"], old.status["reason"]) == (plansnap.ABANDONED, plansnap.NOT_JOURNALED)
    assert old.requeue_after is None


def test_files_gone_after_the_start_abandon_it() -> None:
    gone = observe(progress(wire.MISSING), {"state": plansnap.IN_PROGRESS, "path": PATH})
    assert (gone.status["state"], gone.status["reason"]) == (plansnap.ABANDONED, plansnap.FILES_GONE)


def test_a_path_the_servers_cannot_write_is_refused_before_a_save() -> None:
    unwritable = replace(progress(wire.MISSING), writable=False, detail="cannot write in /snaps: PermissionError")
    seen = observe(unwritable)
    assert (seen.status["state"], seen.status["reason"]) == (plansnap.TRIGGER_PENDING, plansnap.PATH_UNUSABLE)
    assert "cannot write in /snaps: PermissionError" in seen.status["message"] and "uid 1000" in seen.status["message"]


def test_a_path_holding_something_else_is_refused_before_anything_is_written() -> None:
    other = replace(progress(wire.UNKNOWN), detail="it holds no tf.data snapshot (no snapshot.metadata)")
    seen = observe(other)
    assert (seen.status["state"], seen.status["reason"]) == (plansnap.TRIGGER_PENDING, plansnap.PATH_UNUSABLE)
    assert "Nothing there was touched" in seen.status["message"]
    assert [(e[0], e[1]) for e in seen.events] == [("Warning", plansnap.PATH_UNUSABLE)]


def test_an_unreadable_dispatcher_keeps_the_last_state_and_says_why() -> None:
    seen = observe(plansnap.Unreadable("connection refused"), {"state": plansnap.IN_PROGRESS, "elements": 5})
    assert seen.status["state"] == plansnap.IN_PROGRESS and seen.status["elements"] == 5
    assert seen.status["reason"] == plansnap.DISPATCHER_UNREADABLE and "connection refused" in seen.status["message"]
    assert seen.events == ()


def test_a_final_snapshot_is_not_read_again() -> None:
    assert plansnap.needs_reading({}, plansnap.Target(PATH))
    assert plansnap.needs_reading({"state": plansnap.IN_PROGRESS}, plansnap.Target(PATH))
    for state in plansnap.FINAL:
        assert not plansnap.needs_reading({"state": state}, plansnap.Target(PATH))
    assert not plansnap.needs_reading({}, plansnap.Target(None, plansnap.NO_SNAPSHOT_STORAGE))


# --- One path, one TFDataSnapshot ------------------------------------------------------------


def named(name: str, created: str, status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """A TFDataSnapshot ``name`` whose snapshot name is imagenet-v3 (the path PATH on service demo)."""
    body = snapshot_body(status=status, **({"snapshotName": "imagenet-v3"} | spec))
    body["metadata"] |= {"name": name, "uid": f"uid-{name}", "creationTimestamp": created}
    return body


FIRST = named("first", "2026-11-27T10:00:00Z")
SECOND = named("second", "2026-11-27T10:05:00Z")


def claims(*bodies: dict[str, Any], service: dict[str, Any] | None = None) -> list[plansnap.Claim]:
    found = [plansnap.claim_of(b, service or with_snapshots(), None) for b in bodies]
    return [c for c in found if c is not None]


def target_of(body: dict[str, Any], *rivals: plansnap.Claim, service: dict[str, Any] | None = None) -> plansnap.Target:
    status = body.get("status") or {}
    return plansnap.target(snapshotapi.parse(body), service or with_snapshots(), None, status, rivals)


def test_the_later_of_two_snapshots_of_one_path_is_refused_naming_the_first() -> None:
    assert target_of(FIRST, *claims(SECOND)).path == PATH
    refused = target_of(SECOND, *claims(FIRST))
    assert (refused.path, refused.reason, refused.taken_by) == (None, plansnap.PATH_TAKEN, "first")
    assert refused.message.startswith(f"{PATH} is TFDataSnapshot first's (created 2026-11-27T10:00:00Z)")
    seen = plansnap.observe(snapshotapi.parse(SECOND), refused, None, {}, NOW)
    assert (seen.status["state"], seen.status["reason"]) == (plansnap.TRIGGER_PENDING, plansnap.PATH_TAKEN)
    assert not plansnap.needs_reading(seen.status, refused), "a refused one never asks the dispatcher"
    assert [(e[0], e[1]) for e in seen.events] == [("Warning", plansnap.PATH_TAKEN)]
    assert seen.requeue_after == plansnap.RECHECK_SECONDS
    again = plansnap.observe(snapshotapi.parse(SECOND), refused, None, seen.status, NOW)
    assert again.status == seen.status and again.events == (), "the Warning is said once"
    # Created in the same second: the first name keeps it.
    twin = named("another", "2026-11-27T10:00:00Z")
    assert target_of(twin, *claims(FIRST)).path == PATH
    assert target_of(FIRST, *claims(twin)).taken_by == "another"


def test_a_refused_snapshot_follows_the_path_by_itself_once_the_first_is_gone() -> None:
    refused = plansnap.observe(snapshotapi.parse(SECOND), target_of(SECOND, *claims(FIRST)), None, {}, NOW)
    free = target_of(SECOND)  # the first deleted: the watch no longer has it
    assert free.path == PATH and plansnap.needs_reading(refused.status, free)
    seen = plansnap.observe(snapshotapi.parse(SECOND), free, progress(wire.COMPLETED), refused.status, NOW)
    assert (seen.status["state"], seen.status["path"]) == (plansnap.COMPLETED, PATH)
    # Or once the first names another path (its service's directory changed before it started).
    moved_away = named("first", "2026-11-27T10:00:00Z")
    assert target_of(SECOND, *claims(moved_away, service=with_snapshots(MOVED))).path == PATH


def test_two_services_sharing_a_directory_share_its_paths_unless_each_mounts_its_own_claim() -> None:
    other = named("first", "2026-11-27T10:00:00Z", service="other")
    assert target_of(SECOND, *claims(other)).reason == plansnap.PATH_TAKEN
    # The same place written two ways: file:///x is /x, and /x//y is /x/y.
    local, url = with_snapshots("/snaps"), with_snapshots("file:///snaps/")
    assert target_of(SECOND, *claims(other, service=url), service=local).reason == plansnap.PATH_TAKEN
    # Two claims mounted at one path are two places; one claim and an unknown mount may be one.
    on_a, on_b = (with_snapshots("/snaps") for _ in "ab")
    on_a["spec"]["snapshots"]["volume"], on_b["spec"]["snapshots"]["volume"] = {"claimName": "a"}, {"claimName": "b"}
    assert target_of(SECOND, *claims(other, service=on_a), service=on_b).path == "/snaps/imagenet-v3"
    assert target_of(SECOND, *claims(other, service=on_a), service=local).reason == plansnap.PATH_TAKEN


def test_a_snapshot_whose_save_started_keeps_its_path_before_an_earlier_one_that_has_not() -> None:
    started = named("second", "2026-11-27T10:05:00Z", status={"state": plansnap.COMPLETED, "path": PATH})
    assert target_of(started, *claims(FIRST)).path == PATH
    assert target_of(FIRST, *claims(started)).taken_by == "second"
    # Of two started ones (written before this rule), the first created keeps it.
    first_started = named("first", "2026-11-27T10:00:00Z", status={"state": plansnap.COMPLETED, "path": PATH})
    assert target_of(started, *claims(first_started)).taken_by == "first"


@pytest.mark.parametrize("state", plansnap.STATES)
def test_a_refused_snapshots_deletion_deletes_nothing(state: str) -> None:
    # In any state: two that both followed the path before this rule, the later refused now.
    first = named("first", "2026-11-27T10:00:00Z", status={"state": plansnap.COMPLETED, "path": PATH})
    body = named("second", "2026-11-27T10:05:00Z", status={"state": state, "path": PATH}, deletionPolicy="Delete")
    d = snapshotdeletion.deletion(snapshotapi.parse(body), target_of(body, *claims(first)), body["status"], True)
    assert d.release and not d.delete_data and d.reason == plansnap.DATA_KEPT and "first" in d.message


def test_data_is_deleted_only_once_the_api_server_lists_no_rival_the_watch_has_not_delivered() -> None:
    snap_ = snapshotapi.parse(FIRST)
    assert snapshotdeletion.unseen_rivals(snap_, [FIRST, SECOND], ["uid-second"]) is None
    other_name = named("third", "2026-11-27T09:00:00Z", snapshotName="imagenet-v4")
    assert snapshotdeletion.unseen_rivals(snap_, [FIRST, other_name], []) is None
    wait = snapshotdeletion.unseen_rivals(snap_, [FIRST, SECOND], [])
    assert wait is not None and not wait.release and not wait.delete_data
    assert wait.reason == plansnap.DELETION_WAITS and "TFDataSnapshot second names the same snapshot" in wait.message


# A later spec.snapshots.directory of the service, and where it puts the same name.
MOVED = "gs://other-bucket/snaps"
MOVED_PATH = f"{MOVED}/imagenet-v3"


def test_before_a_save_the_path_follows_the_services_directory() -> None:
    waiting = {"state": plansnap.TRIGGER_PENDING, "path": PATH, "reason": plansnap.WAITING_FOR_SAVE}
    target = plansnap.target(snap(), with_snapshots(MOVED), None, waiting)
    assert (target.path, target.spec_path) == (MOVED_PATH, None)
    assert plansnap.observe(snap(), target, progress(wire.MISSING), waiting, NOW).status["path"] == MOVED_PATH


@pytest.mark.parametrize("state", [plansnap.IN_PROGRESS, plansnap.COMPLETED, plansnap.FAILED, plansnap.ABANDONED])
def test_once_a_save_started_the_path_stays_and_a_directory_edit_is_only_said(state: str) -> None:
    old = {"state": state, "reason": "Before", "message": "as read before", "path": PATH}
    target = plansnap.target(snap(), with_snapshots(MOVED), None, old)
    assert (target.path, target.spec_path) == (PATH, MOVED_PATH)
    assert plansnap.needs_reading(old, target) == (state == plansnap.IN_PROGRESS)
    reading = progress(wire.IN_PROGRESS) if state == plansnap.IN_PROGRESS else None  # read at PATH
    seen = plansnap.observe(snap(), target, reading, old, NOW)
    assert seen.status["path"] == PATH and seen.status["state"] == state and seen.events == ()
    message = seen.status["message"]
    assert message.endswith(
        f"A save of this name now goes to {MOVED_PATH}: create another TFDataSnapshot to follow that one"
    )
    assert f"its data stays at {PATH}, the only path the operator reads" in message
    # Said once: the next pass writes the same status; with the directory put back, the sentence goes.
    assert plansnap.observe(snap(), target, reading, seen.status, NOW).status == seen.status
    back = plansnap.target(snap(), with_snapshots(), None, seen.status)
    assert (back.path, back.spec_path) == (PATH, None)
    restored = plansnap.observe(snap(), back, reading, seen.status, NOW).status
    assert "Since this snapshot started" not in restored["message"]
    if reading is None:
        assert restored == old


# --- Deletion ------------------------------------------------------------------------------


def deletion(state: str | None, policy: str = "Delete", target: plansnap.Target | None = None, fresh: bool = True):  # type: ignore[no-untyped-def]
    status = {"path": PATH} | ({"state": state} if state else {})
    return snapshotdeletion.deletion(snap(deletionPolicy=policy), target or plansnap.Target(PATH), status, fresh)


def test_retain_lets_the_resource_go_and_touches_nothing() -> None:
    for state in (*plansnap.STATES, None):
        d = deletion(state, policy="Retain")
        assert d.release and not d.delete_data


def test_delete_waits_while_written_and_deletes_data_once_final() -> None:
    waits = deletion(plansnap.IN_PROGRESS)
    assert not waits.release and not waits.delete_data and waits.reason == plansnap.DELETION_WAITS
    assert SNAPSHOT_FINALIZER in waits.message and waits.requeue_after == plansnap.POLL_SECONDS
    for state in (plansnap.COMPLETED, plansnap.FAILED):
        d = deletion(state)
        assert d.delete_data and not d.release


def test_delete_of_an_abandoned_snapshot_lets_it_go_and_says_what_is_left() -> None:
    status = {"path": PATH, "state": plansnap.ABANDONED, "reason": plansnap.NOT_JOURNALED}
    kept = snapshotdeletion.deletion(snap(deletionPolicy="Delete"), plansnap.Target(PATH), status, True)
    assert kept.release and not kept.delete_data and kept.reason == plansnap.DATA_KEPT and "by hand" in kept.message
    gone = snapshotdeletion.deletion(
        snap(deletionPolicy="Delete"), plansnap.Target(PATH), status | {"reason": "FilesGone"}, True
    )
    assert gone.release and not gone.delete_data and not gone.reason


def test_a_deleted_snapshots_files_are_no_place_for_a_new_one() -> None:
    seen = observe(progress(wire.DELETED))
    assert (seen.status["state"], seen.status["reason"]) == (plansnap.TRIGGER_PENDING, plansnap.PATH_UNUSABLE)
    later = observe(progress(wire.DELETED), {"state": plansnap.COMPLETED, "path": PATH})
    assert (later.status["state"], later.status["reason"]) == (plansnap.ABANDONED, plansnap.DATA_DELETED)


def test_delete_of_a_snapshot_never_started_releases_only_on_a_fresh_missing_reading() -> None:
    assert deletion(plansnap.TRIGGER_PENDING).release
    unsure = deletion(plansnap.TRIGGER_PENDING, fresh=False)
    assert not unsure.release and not unsure.delete_data and unsure.requeue_after == plansnap.POLL_SECONDS


def test_delete_without_the_service_or_its_storage_keeps_the_files_and_warns() -> None:
    gone = deletion(plansnap.COMPLETED, target=plansnap.Target(None, plansnap.SERVICE_NOT_FOUND, "gone", exists=False))
    assert gone.release and not gone.delete_data and gone.event_type == "Warning" and PATH in gone.message
    never = deletion(plansnap.TRIGGER_PENDING, target=plansnap.Target(None, plansnap.SERVICE_NOT_FOUND, exists=False))
    assert never.release and not never.delete_data and not never.reason
    bare = deletion(plansnap.COMPLETED, target=plansnap.Target(None, plansnap.NO_SNAPSHOT_STORAGE, "no storage"))
    assert bare.release and not bare.delete_data and "no storage" in bare.message


# --- The controller ------------------------------------------------------------------------


@dataclass
class FakeApi:
    statuses: list[dict[str, Any]] = field(default_factory=list)
    patches: list[dict[str, Any]] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)
    conflict: bool = False
    # The TFDataSnapshots a list of the namespace answers (the API server's, not the watch's).
    listed: list[dict[str, Any]] = field(default_factory=list)
    lists: int = 0
    written_for: list[str] = field(default_factory=list)  # whose status each write was

    def list_objects(self, api_version: str, kind: str, namespace: str) -> list[dict[str, Any]]:
        self.lists += 1
        return self.listed

    def patch(self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if self.conflict:
            raise ApiException(status=409, reason="Conflict")
        self.patches.append(patch)
        return {"metadata": {"name": name, "namespace": namespace, **patch["metadata"], "resourceVersion": "8"}}

    def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        self.statuses.append(status)
        self.written_for.append(name)
        return {"metadata": {"name": name, "namespace": namespace}, "status": status}

    def event(self, owner: Any, event_type: str, reason: str, message: str) -> None:
        self.events.append((event_type, reason))


@dataclass
class FakeDispatcher:
    answer: SnapshotsReport | str
    refuse: str | None = None
    asked: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def readers(self) -> SnapshotReaders:
        return SnapshotReaders(self.fetch, self.delete, lambda: NOW)

    def fetch(self, url: str) -> SnapshotsReport | str:
        self.asked.append(url)
        return self.answer

    def delete(self, url: str) -> str | None:
        self.deleted.append(url)
        return self.refuse


def service(directory: str = DIRECTORY) -> controller.Service:
    body = with_snapshots(directory)
    return controller.Service(body, Children(name="demo"))


def run(
    body: dict[str, Any],
    dispatcher: FakeDispatcher,
    api: FakeApi | None = None,
    directory: str = DIRECTORY,
    rivals: tuple[controller.Rival, ...] = (),
) -> FakeApi:
    api = api or FakeApi()
    controller.reconcile_snapshot(api, OperatorConfig(), body, service(directory), dispatcher.readers(), rivals)
    return api


def report(*entries: SnapshotProgress) -> SnapshotsReport:
    return SnapshotsReport(entries, "journal")


def test_the_controller_adds_the_finalizer_reads_the_path_and_writes_the_status_once() -> None:
    dispatcher = FakeDispatcher(report(progress(wire.IN_PROGRESS, streams_total=2)))
    api = run(snapshot_body("Delete"), dispatcher)
    assert api.patches == [{"metadata": {"finalizers": [SNAPSHOT_FINALIZER], "resourceVersion": "7"}}]
    assert len(dispatcher.asked) == 1 and "path=gs%3A%2F%2Fbucket%2Fsnaps%2Fimagenet-v3" in dispatcher.asked[0]
    assert "/v1/snapshots?" in dispatcher.asked[0] and "demo-dispatcher" in dispatcher.asked[0]
    assert [s["state"] for s in api.statuses] == [plansnap.IN_PROGRESS]
    assert api.events == [("Normal", "SnapshotStarted")]
    settled = snapshot_body("Delete", status=api.statuses[0])
    settled["metadata"]["finalizers"] = [SNAPSHOT_FINALIZER]
    quiet = run(settled, dispatcher)
    assert (quiet.patches, quiet.statuses, quiet.events) == ([], [], [])


def test_a_long_tensorflow_error_fails_the_snapshot_within_the_crds_bounds() -> None:
    # TensorFlow's errors carry stacks up to the 4,000 characters the dispatcher keeps; with the path
    # and the counts around it the message is over the CRD's 4,096, and a refused patch would leave
    # the snapshot IN_PROGRESS for good.
    frames = "tensorflow/core/data/service/snapshot/snapshot_stream_writer.cc:1 " * 60
    error = ("INTERNAL: Failed to write chunk\n\t\x1b[1m" + frames)[: wire.MAX_ERROR_CHARACTERS]
    dispatcher = FakeDispatcher(report(progress(wire.FAILED, error=error)))
    in_progress = {"state": plansnap.IN_PROGRESS, "path": PATH, "observedGeneration": 1}
    api = run(snapshot_body(status=in_progress), dispatcher)
    (written,) = api.statuses
    assert written["state"] == plansnap.FAILED and beyond_crd(written, status_schema(SNAPSHOT_CRD_PATH)) == []
    assert written["message"].startswith(f"snapshot {PATH} failed: 0/0 streams done") and written["message"][-1] == "…"
    assert written["error"].startswith("INTERNAL: Failed to write chunk tensorflow/core/data/service/")
    assert not any(c in written["message"] + written["error"] for c in "\x1b\n\t")
    assert api.events == [("Warning", "SnapshotFailed")]
    # Stored as it was written: the next reconcile writes nothing.
    assert run(snapshot_body(status=written), dispatcher).statuses == []


def test_a_completed_snapshot_is_not_read_and_retain_removes_a_left_finalizer() -> None:
    dispatcher = FakeDispatcher("should not be asked")
    body = snapshot_body(status={"state": plansnap.COMPLETED, "path": PATH, "observedGeneration": 1})
    body["metadata"]["finalizers"] = ["other", SNAPSHOT_FINALIZER]
    api = run(body, dispatcher)
    assert dispatcher.asked == [] and api.statuses == []
    assert api.patches == [{"metadata": {"finalizers": ["other"], "resourceVersion": "7"}}]


def deleting(state: str) -> dict[str, Any]:
    body = snapshot_body("Delete", status={"state": state, "path": PATH, "observedGeneration": 1})
    body["metadata"] |= {"finalizers": [SNAPSHOT_FINALIZER], "deletionTimestamp": "2026-11-27T12:00:00Z"}
    return body


def test_deleting_a_completed_snapshot_asks_the_dispatcher_then_releases() -> None:
    dispatcher = FakeDispatcher("not read")
    api = run(deleting(plansnap.COMPLETED), dispatcher)
    assert len(dispatcher.deleted) == 1 and "path=" in dispatcher.deleted[0]
    assert api.patches == [{"metadata": {"finalizers": [], "resourceVersion": "7"}}]
    assert api.events == [("Normal", plansnap.DATA_DELETED)]


def test_a_refused_deletion_keeps_the_finalizer_and_says_why() -> None:
    dispatcher = FakeDispatcher("not read", refuse="DELETE ... answered 409 Conflict: being written")
    api = run(deleting(plansnap.COMPLETED), dispatcher)
    assert api.patches == []
    assert api.statuses[-1]["reason"] == plansnap.DELETE_FAILED and "409" in api.statuses[-1]["message"]


class Bucket(LocalFileSystem):
    """``gs://bucket`` as a directory on this machine (the dispatcher's TensorFlow reads the store);
    a removal of ``held`` waits for ``release`` (``entered`` is set then)."""

    def __init__(self, root: Path, held: str, entered: threading.Event, release: threading.Event) -> None:
        self.root, self.held, self.entered, self.release = root, held, entered, release

    def local(self, path: str) -> str:
        return path.replace("gs://bucket", str(self.root), 1)

    def listdir(self, path: str) -> list[str]:
        return super().listdir(self.local(path))

    def size_and_mtime(self, path: str) -> tuple[int, float]:
        return super().size_and_mtime(self.local(path))

    def read(self, path: str, offset: int = 0) -> bytes:
        return super().read(self.local(path), offset)

    def write(self, path: str, data: bytes) -> None:
        super().write(self.local(path), data)

    def remove_tree(self, path: str) -> None:
        if path == self.held:
            self.entered.set()
            assert self.release.wait(30), "the test never let the store go on"
        super().remove_tree(self.local(path))

    def symlinks(self, path: str) -> list[str]:
        return super().symlinks(self.local(path))


def test_a_deletion_the_dispatcher_carries_out_in_the_background_holds_no_worker_and_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatcher's reader over HTTP: the operator's DELETE answers at once while the removal
    waits on the store; the operator keeps the finalizer, says the data is being deleted (no
    failure, no Event) and asks again in 15 s; a second try is told it is still under way, and a
    dispatcher removing as many snapshots as it does at once (503) is waited for the same way; once
    the files are gone, the next try lets the resource go."""
    monkeypatch.setattr(snapshot_server, "MAX_REMOVALS", 1)
    for name in ("imagenet-v3", "running", "other"):
        (tmp_path / "snaps" / name / "chunks").mkdir(parents=True)
        (tmp_path / "snaps" / name / "snapshot.metadata").write_text('element_spec: "x"\n')
    (tmp_path / "snaps" / "imagenet-v3" / "DONE").write_bytes(b"")
    (tmp_path / "snaps" / "other" / "DONE").write_bytes(b"")
    entered, release = threading.Event(), threading.Event()
    reader = SnapshotReader(Bucket(tmp_path, PATH, entered, release), None, DIRECTORY)
    server = health.HealthServer(
        probestate.ProbeState("snapshots"),
        0,
        host="127.0.0.1",
        delete_routes={wire.SNAPSHOTS_PATH: reader.delete_route},
    )
    server.start()

    def delete(url: str) -> str | None:  # the dispatcher's address, here on 127.0.0.1
        return probes.delete_snapshot(urllib.parse.urlsplit(url)._replace(netloc=f"127.0.0.1:{server.port}").geturl())

    readers = SnapshotReaders(lambda url: "not read", delete, lambda: NOW)
    try:
        for said in ("in the background", "is still removing its files"):
            api = FakeApi()
            started = time.monotonic()
            outcome = controller.reconcile_snapshot(
                api, OperatorConfig(), deleting(plansnap.COMPLETED), service(), readers
            )
            assert time.monotonic() - started < 5.0, "the operator waited for the removal"
            assert entered.wait(10), "the removal never reached the store"
            assert api.patches == [] and api.events == [], "the finalizer stays, and nothing failed"
            (status,) = api.statuses
            assert status["reason"] == plansnap.DATA_BEING_DELETED, status
            assert f"the data at {PATH} is being deleted by the dispatcher" in status["message"], status
            assert said in status["message"] and "could not" not in status["message"], status
            assert outcome.requeue_after == plansnap.POLL_SECONDS
        # A refusal is not mistaken for a removal under way; a dispatcher busy removing is.
        refused = delete(f"http://x{wire.SNAPSHOTS_PATH}?path={DIRECTORY}/running")
        assert not isinstance(refused, probes.UnderWay) and refused is not None and "409" in refused, refused
        busy = delete(f"http://x{wire.SNAPSHOTS_PATH}?path={DIRECTORY}/other")
        assert isinstance(busy, probes.UnderWay) and "nothing was started" in busy, busy
        assert (tmp_path / "snaps" / "other" / "DONE").exists()
    finally:
        release.set()
    try:
        deadline = time.monotonic() + 10
        while (tmp_path / "snaps" / "imagenet-v3").exists():
            assert time.monotonic() < deadline, "the removal did not end"
            time.sleep(0.01)
        api = FakeApi()
        for _ in range(100):  # the removal's thread says it has ended just after the files are gone
            controller.reconcile_snapshot(api, OperatorConfig(), deleting(plansnap.COMPLETED), service(), readers)
            if api.patches:
                break
            time.sleep(0.01)
        assert api.patches == [{"metadata": {"finalizers": [], "resourceVersion": "7"}}]
        assert api.events == [("Normal", plansnap.DATA_DELETED)]
    finally:
        server.stop()


def test_deleting_a_snapshot_being_written_waits_without_deleting() -> None:
    dispatcher = FakeDispatcher(report(progress(wire.IN_PROGRESS)))
    api = run(deleting(plansnap.IN_PROGRESS), dispatcher)
    assert dispatcher.deleted == [] and api.patches == []
    assert api.statuses[-1]["reason"] == plansnap.DELETION_WAITS


def test_deleting_when_the_dispatcher_cannot_say_waits() -> None:
    dispatcher = FakeDispatcher("connection refused")
    api = run(deleting(plansnap.TRIGGER_PENDING), dispatcher)
    assert dispatcher.deleted == [] and api.patches == []
    assert api.statuses[-1]["reason"] == plansnap.DELETION_WAITS


def test_deleting_after_a_directory_edit_deletes_the_frozen_path_only() -> None:
    dispatcher = FakeDispatcher("not read")
    api = run(deleting(plansnap.COMPLETED), dispatcher, directory=MOVED)
    (url,) = dispatcher.deleted
    assert "path=gs%3A%2F%2Fbucket%2Fsnaps%2Fimagenet-v3" in url and "other-bucket" not in url
    assert api.events == [("Normal", plansnap.DATA_DELETED)]
    assert api.patches == [{"metadata": {"finalizers": [], "resourceVersion": "7"}}]
    # A dispatcher that deletes only in its new directory refuses; the status says how to go on.
    refused = FakeDispatcher("not read", refuse="DELETE ... answered 403 Forbidden: not a snapshot of this service")
    api = run(deleting(plansnap.COMPLETED), refused, directory=MOVED)
    assert ["other-bucket" in url for url in refused.deleted] == [False] and api.patches == []
    assert "403" in api.statuses[-1]["message"] and "put the directory back" in api.statuses[-1]["message"]


def test_the_controller_refuses_the_second_snapshot_of_a_path_and_lets_it_go_without_deleting() -> None:
    dispatcher = FakeDispatcher(report(progress(wire.COMPLETED)))
    first = controller.Rival(FIRST, with_snapshots())
    second = named("second", "2026-11-27T10:05:00Z", deletionPolicy="Delete")
    api = run(second, dispatcher, rivals=(first,))
    assert dispatcher.asked == [] and [s["reason"] for s in api.statuses] == [plansnap.PATH_TAKEN]
    assert api.events == [("Warning", plansnap.PATH_TAKEN)]
    second = named("second", "2026-11-27T10:05:00Z", status=api.statuses[0], deletionPolicy="Delete")
    second["metadata"] |= {"finalizers": [SNAPSHOT_FINALIZER], "resourceVersion": "8"}
    assert run(second, dispatcher, rivals=(first,)).statuses == [], "nothing more to write"
    second["metadata"]["deletionTimestamp"] = "2026-11-27T12:00:00Z"
    api = run(second, dispatcher, rivals=(first,))
    assert dispatcher.deleted == [] and dispatcher.asked == [] and api.lists == 0
    assert api.patches == [{"metadata": {"finalizers": [], "resourceVersion": "8"}}]
    assert api.events == [("Normal", plansnap.DATA_KEPT)]


def test_the_first_snapshot_of_a_path_deletes_its_data_only_when_the_watch_has_every_rival() -> None:
    first = named(
        "first", "2026-11-27T10:00:00Z", status={"state": plansnap.COMPLETED, "path": PATH}, deletionPolicy="Delete"
    )
    first["metadata"] |= {"finalizers": [SNAPSHOT_FINALIZER], "deletionTimestamp": "2026-11-27T12:00:00Z"}
    dispatcher = FakeDispatcher("not read")
    # After a restart the watch has not delivered the second yet: the list shows it, nothing is deleted.
    api = run(first, dispatcher, FakeApi(listed=[first, SECOND]))
    assert dispatcher.deleted == [] and api.patches == [] and api.lists == 1
    assert api.statuses[-1]["reason"] == plansnap.DELETION_WAITS
    api = run(first, dispatcher, FakeApi(listed=[first, SECOND]), rivals=(controller.Rival(SECOND, with_snapshots()),))
    assert len(dispatcher.deleted) == 1 and api.events == [("Normal", plansnap.DATA_DELETED)]


def snapshot_memo(api: FakeApi, dispatcher: FakeDispatcher) -> OperatorState:
    """The operator's state with an in-memory cache holding the service demo (with spec.snapshots)."""
    memo = handlers.new_memo(OperatorConfig())
    memo.indices = {kind.index: {} for kind in children.OBSERVED}
    memo.indices[handlers.SERVICES_INDEX] = {("ml", "demo"): [cache.pack(with_snapshots())]}
    memo.kube, memo.snapshot_readers, memo.tasks = api, dispatcher.readers(), []  # type: ignore[assignment]
    memo.indexed.set()
    memo.leading.set()
    return memo


async def watched(memo: OperatorState, body: dict[str, Any]) -> None:
    name = body["metadata"]["name"]
    await handlers.snapshot_event(event={"type": "ADDED"}, body=body, namespace="ml", name=name, memo=memo)


def test_the_watch_gives_each_snapshot_its_rivals_and_a_refused_one_is_queued_when_the_first_goes() -> None:
    """The operator's own wiring (controller/handlers.py) on an in-memory cache: the watch's bodies
    make the refusal, and the first one's DELETED event queues the second, which then follows."""
    dispatcher = FakeDispatcher(report(progress(wire.IN_PROGRESS)))
    api = FakeApi()

    async def scenario() -> list[Any]:
        memo = snapshot_memo(api, dispatcher)
        memo.snapshot_queue, memo.snapshot_pool = WorkQueue(), ThreadPoolExecutor(max_workers=1)
        for body in (FIRST, SECOND):
            await watched(memo, body)
        queued = [await memo.snapshot_queue.get() for _ in range(2)]
        for key in queued:
            memo.snapshot_queue.done(key)
        await handlers._reconcile_snapshot(memo, ("ml", "second"))
        refused = (list(dispatcher.asked), [s["reason"] for s in api.statuses])
        await handlers.snapshot_event(event={"type": "DELETED"}, body=FIRST, namespace="ml", name="first", memo=memo)
        requeued = [await asyncio.wait_for(memo.snapshot_queue.get(), 5)]
        await handlers._reconcile_snapshot(memo, ("ml", "second"))
        memo.snapshot_pool.shutdown()
        return [queued, refused, requeued, len(dispatcher.asked), api.statuses[-1]["state"]]

    queued, refused, requeued, asked, state = asyncio.run(scenario())
    assert queued == [("ml", "first"), ("ml", "second")]
    assert refused == ([], [plansnap.PATH_TAKEN])
    assert requeued == [("ml", "second")]
    assert (asked, state) == (1, plansnap.IN_PROGRESS)


@dataclass
class SlowDispatcher(FakeDispatcher):
    """Deletes only once ``gate`` is set: a dispatcher whose store takes its time."""

    gate: threading.Event = field(default_factory=threading.Event)

    def delete(self, url: str) -> str | None:
        self.gate.wait(10)
        return super().delete(url)


def test_a_deletion_that_waits_on_its_dispatcher_holds_up_no_other_snapshot() -> None:
    dispatcher, api = SlowDispatcher(report(progress(wire.MISSING))), FakeApi()
    slow = named(
        "slow", "2026-11-27T10:00:00Z", status={"state": plansnap.COMPLETED, "path": PATH}, deletionPolicy="Delete"
    )
    slow["metadata"] |= {"finalizers": [SNAPSHOT_FINALIZER], "deletionTimestamp": "2026-11-27T12:00:00Z"}
    others = [named(f"quick-{i}", "2026-11-27T10:00:00Z", snapshotName=f"quick-{i}") for i in range(3)]

    async def scenario() -> tuple[set[str], list[str]]:
        memo = snapshot_memo(api, dispatcher)
        handlers.start_snapshot_workers(memo)
        await watched(memo, slow)
        for body in others:
            await watched(memo, body)
        deadline = asyncio.get_running_loop().time() + 10
        while len(api.statuses) < len(others) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        done_meanwhile = set(api.written_for)
        dispatcher.gate.set()
        while not api.patches and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        for task in memo.tasks:
            task.cancel()
        memo.snapshot_pool.shutdown()
        return done_meanwhile, [p["metadata"]["finalizers"] for p in api.patches]

    done_meanwhile, finalizers = asyncio.run(scenario())
    assert done_meanwhile == {"quick-0", "quick-1", "quick-2"}, "the others waited for the slow deletion"
    assert finalizers == [[]] and len(dispatcher.deleted) == 1


def test_an_unreadable_dispatcher_is_backed_off_not_asked_every_15_s_with_a_whole_timeout() -> None:
    clock = Clock()
    dispatcher = FakeDispatcher("GET http://demo-dispatcher/v1/snapshots failed: no whole answer within 5s (timed out)")
    pods = SnapshotReaders(dispatcher.fetch, dispatcher.delete, lambda: NOW, seconds=clock)
    body, asked_at = snapshot_body("Retain"), []
    while clock.now < 1000 + 1300:
        before = len(dispatcher.asked)
        outcome = controller.reconcile_snapshot(FakeApi(), OperatorConfig(), body, service(), pods)
        if len(dispatcher.asked) > before:
            asked_at.append(clock.now - 1000)
        assert outcome.requeue_after is not None and outcome.requeue_after >= plansnap.POLL_SECONDS
        clock.now += outcome.requeue_after
    # Every 15 s at first, then no sooner than its back-off (5 s doubling to 2 minutes) allows.
    assert asked_at == [0, 15, 30, 60, 100, 180, 300, 420, 540, 660, 780, 900, 1020, 1140, 1260]
