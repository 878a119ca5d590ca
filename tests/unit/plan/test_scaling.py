"""The scaling order: no worker ever runs while missing from the dispatcher's list."""

from __future__ import annotations

from typing import Any

import pytest

from tfdata_operator.api import spec
from tfdata_operator.plan import desired as plan
from tfdata_operator.plan import scaling
from tfdata_operator.render import builders
from tfdata_operator.render.builders import BuildSettings

from fixtures.cases import parse

SETTINGS = BuildSettings()


class FakeCluster:
    """Just enough StatefulSet behaviour to replay reconcile steps: pods follow replicas one step later."""

    def __init__(self) -> None:
        self.dispatcher: dict[str, Any] | None = None
        self.workers: dict[str, Any] | None = None
        self.worker_pods: list[str] = []
        self.dispatcher_ready = False
        self.revision = "r0"

    def children(self) -> plan.Children:
        pods = [
            {"metadata": {"name": n, "labels": {"app.kubernetes.io/component": "worker"}}} for n in self.worker_pods
        ]
        if self.dispatcher is not None:
            labels = {"app.kubernetes.io/component": "dispatcher", "controller-revision-hash": self.revision}
            started = {"containerStatuses": [{"started": self.dispatcher_ready}]}
            pods.append({"metadata": {"name": "demo-dispatcher-0", "labels": labels}, "status": started})
        objects = {("StatefulSet", o["metadata"]["name"]): o for o in (self.dispatcher, self.workers) if o}
        return plan.Children("demo", objects, pods)

    def apply(self, svc: spec.ServiceSpec) -> scaling.ScaleStep | None:
        desired = plan.desired_children(svc, SETTINGS, self.children())
        by_name = {m["metadata"]["name"]: m for m in desired.apply if m["kind"] == "StatefulSet"}
        new_dispatcher = by_name[builders.dispatcher_name(svc)]
        if self.dispatcher is None or builders.read_config(self.dispatcher) != builders.read_config(new_dispatcher):
            self.dispatcher_ready = False  # the dispatcher pod restarts with the new template
            self.revision = f"r{int(self.revision[1:]) + 1}"
        self.dispatcher = self._with_status(new_dispatcher, self.dispatcher_ready)
        self.workers = self._with_status(by_name[builders.workers_name(svc)], True)
        return desired.waiting  # type: ignore[return-value]

    def settle(self) -> None:
        """The controllers act: the dispatcher becomes ready, worker pods match replicas."""
        self.dispatcher_ready = True
        assert self.dispatcher is not None and self.workers is not None
        self.dispatcher = self._with_status(self.dispatcher, True)
        n = self.workers["spec"]["replicas"]
        self.worker_pods = [f"{self.workers['metadata']['name']}-{i}" for i in range(n)]

    def _with_status(self, sts: dict[str, Any], ready: bool) -> dict[str, Any]:
        n = sts["spec"]["replicas"]
        status = {"observedGeneration": 1, "replicas": n, "updatedReplicas": n, "readyReplicas": n if ready else 0}
        status.update(currentRevision="r", updateRevision="r")
        if sts["metadata"]["name"].endswith("-dispatcher"):
            status.update(updateRevision=self.revision, currentRevision=self.revision if ready else "old")
        return {**sts, "metadata": {**sts["metadata"], "generation": 1}, "status": status}

    def check_invariant(self, svc: spec.ServiceSpec) -> None:
        config = builders.read_config(self.dispatcher)
        listed = set((config or {}).get("worker_addresses") or [])
        fmt = builders.worker_address_format(svc, SETTINGS, svc.workers.port)
        for pod in self.worker_pods:
            address = fmt.replace("{pod_name}", pod)
            assert address in listed, f"worker {pod} runs but the dispatcher's list is {sorted(listed)}"


@pytest.mark.parametrize(("start", "end"), [(2, 3), (2, 5), (4, 2), (3, 1), (1, 4)])
def test_static_scaling_never_leaves_a_worker_out_of_the_list(start: int, end: int) -> None:
    cluster = FakeCluster()
    svc = parse(shardingPolicy="FILE", workers={"replicas": start})
    cluster.apply(svc)
    cluster.settle()
    cluster.check_invariant(svc)

    svc = parse(shardingPolicy="FILE", workers={"replicas": end})
    for _ in range(6):
        cluster.apply(svc)
        cluster.check_invariant(svc)
        cluster.settle()
        cluster.check_invariant(svc)
    config = builders.read_config(cluster.dispatcher)
    assert len(config["worker_addresses"]) == end  # type: ignore[index]
    assert len(cluster.worker_pods) == end


def test_scale_up_moves_the_dispatcher_first() -> None:
    cluster = FakeCluster()
    cluster.apply(parse(shardingPolicy="DATA", workers={"replicas": 2}))
    cluster.settle()
    waiting = cluster.apply(parse(shardingPolicy="DATA", workers={"replicas": 3}))
    assert waiting and "waiting for the dispatcher" in waiting
    assert len(builders.read_config(cluster.dispatcher)["worker_addresses"]) == 3  # type: ignore[index]
    assert cluster.workers["spec"]["replicas"] == 2  # type: ignore[index]
    cluster.settle()
    assert cluster.apply(parse(shardingPolicy="DATA", workers={"replicas": 3})) is None
    assert cluster.workers["spec"]["replicas"] == 3  # type: ignore[index]


def test_scale_down_moves_the_workers_first() -> None:
    cluster = FakeCluster()
    cluster.apply(parse(shardingPolicy="HINT", workers={"replicas": 3}))
    cluster.settle()
    waiting = cluster.apply(parse(shardingPolicy="HINT", workers={"replicas": 2}))
    assert waiting and "waiting for 1 worker pod(s) to stop" in waiting
    assert cluster.workers["spec"]["replicas"] == 2  # type: ignore[index]
    assert len(builders.read_config(cluster.dispatcher)["worker_addresses"]) == 3  # type: ignore[index]
    cluster.settle()
    assert cluster.apply(parse(shardingPolicy="HINT", workers={"replicas": 2})) is None
    assert len(builders.read_config(cluster.dispatcher)["worker_addresses"]) == 2  # type: ignore[index]


def test_every_static_list_change_starts_a_journal_never_used_before() -> None:
    """2 -> 3 -> 2 -> 3 workers: replaying an older journal would hand out task ids the
    long-running workers already finished under a newer one (they answer end of sequence)."""
    cluster = FakeCluster()
    journals = []

    def converge(generation: int, replicas: int) -> None:
        svc = parse(generation=generation, shardingPolicy="FILE", workers={"replicas": replicas})
        for _ in range(4):
            cluster.apply(svc)
            cluster.settle()
            work_dir = builders.read_config(cluster.dispatcher)["work_dir"]  # type: ignore[index]
            if work_dir not in journals[-1:]:
                journals.append(work_dir)

    for generation, replicas in enumerate([2, 3, 2, 3], start=1):
        converge(generation, replicas)
    assert [j.rsplit("/", 1)[1] for j in journals] == ["2-workers-g1", "3-workers-g2", "2-workers-g3", "3-workers-g4"]

    converge(5, 3)  # a change that leaves the list alone (say, resources) keeps the journal
    assert journals[-1].endswith("/3-workers-g4") and len(journals) == 4


def test_dynamic_scaling_follows_the_spec_at_once() -> None:
    cluster = FakeCluster()
    cluster.apply(parse(shardingPolicy="DYNAMIC", workers={"replicas": 2}))
    cluster.settle()
    assert cluster.apply(parse(shardingPolicy="DYNAMIC", workers={"replicas": 7})) is None
    assert cluster.workers["spec"]["replicas"] == 7  # type: ignore[index]


def test_ordinals_count_pods_that_still_exist() -> None:
    assert scaling.highest_ordinal_plus_one(["x-worker-0", "x-worker-3", "other-1"], "x-worker") == 4
    assert scaling.highest_ordinal_plus_one([], "x-worker") == 0


def test_a_pod_stuck_on_an_old_revision_is_replaced_but_a_ready_one_is_not() -> None:
    sts = {
        "metadata": {"name": "x-dispatcher", "uid": "sts-uid"},
        "status": {"currentRevision": "old", "updateRevision": "new", "replicas": 1, "updatedReplicas": 0},
    }

    def pod(name: str, revision: str, ready: bool) -> dict[str, Any]:
        condition = {"type": "Ready", "status": "True" if ready else "False"}
        labels = {"controller-revision-hash": revision}
        meta = {"name": name, "labels": labels, "ownerReferences": [{"uid": "sts-uid"}]}
        return {"metadata": meta, "status": {"conditions": [condition]}}

    pods = [pod("x-dispatcher-0", "old", False), pod("x-dispatcher-1", "old", True), pod("x-other-0", "old", False)]
    orphan = pod("x-dispatcher-0", "old", False)
    orphan["metadata"]["ownerReferences"] = [{"uid": "someone-else"}]
    assert scaling.stuck_pods(sts, [orphan]) == [], "only the StatefulSet's own pods are replaced"
    assert [p["metadata"]["name"] for p in scaling.stuck_pods(sts, pods)] == ["x-dispatcher-0"]
    assert scaling.stuck_pods(sts, [pod("x-dispatcher-0", "new", False)]) == []
    settled = {
        **sts,
        "status": {"currentRevision": "new", "updateRevision": "new", "replicas": 1, "updatedReplicas": 1},
    }
    assert scaling.stuck_pods(settled, pods[:1]) == []


def test_a_dispatcher_counts_as_moved_once_its_new_pod_started_ready_or_not() -> None:
    sts = {
        "metadata": {"name": "x-dispatcher", "generation": 2},
        "status": {"observedGeneration": 2, "updateRevision": "new", "currentRevision": "old"},
    }

    def pod(revision: str, started: bool) -> dict[str, Any]:
        labels = {"controller-revision-hash": revision}
        return {
            "metadata": {"name": "x-dispatcher-0", "labels": labels},
            "status": {"containerStatuses": [{"started": started}]},
        }

    assert scaling.started_on_current_revision(sts, [pod("new", True)])
    assert not scaling.started_on_current_revision(sts, [pod("new", False)])
    assert not scaling.started_on_current_revision(sts, [pod("old", True)])
    stale = {**sts, "status": {**sts["status"], "observedGeneration": 1}}
    assert not scaling.started_on_current_revision(stale, [pod("new", True)])


def _pod(name: str, created: str, ready_since: str | None = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:10:00Z"
    conditions = [{"type": "Ready", "status": "True", "lastTransitionTime": ready_since}] if ready_since else []
    return {"metadata": meta, "status": {"conditions": conditions}}


def test_workers_of_an_earlier_journal_less_dispatcher_pod_are_stale() -> None:
    svc = parse(shardingPolicy="DYNAMIC", dispatcher={"faultTolerantMode": False})
    dispatcher = [_pod("demo-dispatcher-0", created="2026-01-01T00:05:00Z")]
    workers = [
        # created and registered with the earlier dispatcher pod:
        _pod("demo-worker-0", created="2026-01-01T00:00:00Z", ready_since="2026-01-01T00:01:00Z"),
        # created first at service creation, but ready only once this dispatcher ran:
        _pod("demo-worker-1", created="2026-01-01T00:04:59Z", ready_since="2026-01-01T00:05:09Z"),
        # a replacement, even if its node's clock is behind:
        _pod("demo-worker-2", created="2026-01-01T00:05:30Z", ready_since="2026-01-01T00:04:00Z"),
        _pod("demo-worker-3", created="2026-01-01T00:00:00Z"),  # not ready
        _pod("demo-worker-4", created="2026-01-01T00:00:00Z", ready_since="2026-01-01T00:01:00Z", deleting=True),
    ]
    assert [p["metadata"]["name"] for p in scaling.stale_workers(svc, dispatcher, workers)] == ["demo-worker-0"]
    assert scaling.stale_workers(svc, [], workers) == []  # no dispatcher pod (yet)
    # With a journal the new dispatcher continues the task ids: the workers stay.
    journaled = parse(shardingPolicy="DYNAMIC", dispatcher={"faultTolerantMode": True})
    assert scaling.stale_workers(journaled, dispatcher, workers) == []


def test_a_statefulset_is_settled_only_once_its_controller_reported_on_this_generation() -> None:
    assert not scaling.statefulset_settled(None)
    revisions = {"currentRevision": "r", "updateRevision": "r"}
    # Fields Kubernetes leaves out when they are 0 (and spec.replicas, 1 when absent):
    scaled_to_zero = {
        "metadata": {"generation": 1},
        "spec": {"replicas": 0},
        "status": {"observedGeneration": 1, **revisions},
    }
    assert scaling.statefulset_settled(scaled_to_zero)
    counts = {"replicas": 1, "updatedReplicas": 1, "readyReplicas": 1}
    assert scaling.statefulset_settled({"status": {"observedGeneration": 1, **revisions, **counts}})
    # A new StatefulSet the controller has not seen yet, and one whose latest generation it has not seen:
    assert not scaling.statefulset_settled(
        {"metadata": {"generation": 1}, "spec": {"replicas": 0}, "status": revisions}
    )
    behind = {"metadata": {"generation": 5}, "status": {"observedGeneration": 4, **revisions, **counts}}
    assert not scaling.statefulset_settled(behind)
    assert not scaling.statefulset_settled({**behind, "metadata": {"generation": 2}, "spec": {"replicas": 2}})


def test_only_the_live_pod_zero_on_the_current_revision_counts_as_started() -> None:
    sts = {
        "metadata": {"name": "x-dispatcher", "generation": 1},
        "status": {"observedGeneration": 1, "updateRevision": "new"},
    }

    def pod(name: str, state: dict[str, Any], deleting: bool = False, labels: bool = True) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "labels": {"controller-revision-hash": "new"} if labels else {}}
        if deleting:
            meta["deletionTimestamp"] = "T"
        return {"metadata": meta, "status": {"containerStatuses": [{"state": state}]}}

    running = pod("x-dispatcher-0", {"running": {}})
    waiting = pod("x-dispatcher-0", {"waiting": {}})
    assert scaling.started_on_current_revision(sts, [pod("x-worker-0", {}), running])
    assert scaling.started_on_current_revision(sts, [pod("x-dispatcher-0", {}, deleting=True), running])
    assert not scaling.started_on_current_revision(sts, [waiting])
    assert not scaling.started_on_current_revision(sts, [pod("x-worker-0", {"running": {}})])  # no pod 0
    assert not scaling.started_on_current_revision(sts, [pod("x-dispatcher-0", {"running": {}}, deleting=True)])
    assert not scaling.started_on_current_revision(None, [running])
    # Before the controller reports (no status), no pod counts, even one without a revision label:
    unseen = {"metadata": {"name": "x-dispatcher", "generation": 1}}
    assert not scaling.started_on_current_revision(unseen, [pod("x-dispatcher-0", {"running": {}}, labels=False)])
    assert not scaling.started_on_current_revision(
        {**sts, "metadata": {"name": "x-dispatcher"}, "status": {}}, [running]
    )
    # Without metadata (no generation: 1 assumed) and not yet observed: not started, and no error.
    assert not scaling.started_on_current_revision({"status": {}}, [running])


def test_a_new_statefulset_without_replicas_scales_from_zero() -> None:
    svc = parse(shardingPolicy="FILE", workers={"replicas": 2})
    step = scaling.step(svc, {"spec": {}}, None, [], None, lambda n: [str(i) for i in range(n)], 0)
    assert (step.dispatcher_workers, step.worker_replicas) == (2, 0) and step.waiting


def test_stale_workers_skip_the_terminating_pods_on_both_sides() -> None:
    svc = parse(shardingPolicy="DYNAMIC", dispatcher={"faultTolerantMode": False})
    dispatchers = [
        _pod("demo-dispatcher-0", created="2026-01-01T00:00:00Z", deleting=True),
        _pod("demo-dispatcher-0", created="2026-01-01T00:05:00Z"),
    ]
    workers = [
        _pod("demo-worker-0", created="2026-01-01T00:00:00Z", ready_since="2026-01-01T00:01:00Z", deleting=True),
        _pod("demo-worker-1", created="2026-01-01T00:00:00Z", ready_since="2026-01-01T00:01:00Z"),
        # created and ready in the same second as the dispatcher pod: not before it
        _pod("demo-worker-2", created="2026-01-01T00:05:00Z", ready_since="2026-01-01T00:05:00Z"),
        _pod("demo-worker-3", created="2026-01-01T00:00:00Z", ready_since="2026-01-01T00:05:00Z"),
    ]
    assert [p["metadata"]["name"] for p in scaling.stale_workers(svc, dispatchers, workers)] == ["demo-worker-1"]
    untimed = {"metadata": {"name": "demo-worker-4"}, "status": workers[1]["status"]}
    assert scaling.stale_workers(svc, dispatchers[1:], [untimed]) == [untimed]

    def ready(kind: str, flag: str, since: object) -> dict[str, Any]:
        return {**workers[1], "status": {"conditions": [{"type": kind, "status": flag, "lastTransitionTime": since}]}}

    early = "2026-01-01T00:00:30Z"  # before the dispatcher pod, so only the condition's type and status decide
    odd = [
        ready("Ready", "False", early),
        ready("Other", "True", early),
        ready("Ready", "True", None),
        ready("Ready", "True", 5),
    ]
    assert scaling.stale_workers(svc, dispatchers[1:], odd) == []
    # Created in the same second as the dispatcher pod (ready "earlier" by a node clock behind): not stale.
    same_second = _pod("demo-worker-5", created="2026-01-01T00:05:00Z", ready_since="2026-01-01T00:04:00Z")
    assert scaling.stale_workers(svc, dispatchers[1:], [same_second]) == []


def test_a_stuck_pod_is_left_alone_while_it_terminates_and_once_every_pod_is_updated() -> None:
    sts = {
        "metadata": {"name": "x-dispatcher", "uid": "sts-uid"},
        "status": {"currentRevision": "old", "updateRevision": "new", "replicas": 1, "updatedReplicas": 0},
    }
    meta = {
        "name": "x-dispatcher-0",
        "labels": {"controller-revision-hash": "old"},
        "ownerReferences": [{"uid": "sts-uid"}],
    }
    stuck = {"metadata": meta, "status": {}}
    assert scaling.stuck_pods(sts, [stuck]) == [stuck]
    assert scaling.stuck_pods(sts, [{**stuck, "metadata": {**meta, "deletionTimestamp": "T"}}]) == []
    assert scaling.stuck_pods(sts, [{**stuck, "metadata": {**meta, "labels": {}}}]) == []
    # The controller has not switched currentRevision yet, but every pod runs the new template:
    updated = {**sts, "status": {**sts["status"], "updatedReplicas": 1}}
    assert scaling.stuck_pods(updated, [stuck]) == [stuck]
    switched = {**sts, "status": {**sts["status"], "currentRevision": "new"}}
    assert scaling.stuck_pods(switched, [stuck]) == [stuck]


def test_objects_without_optional_fields_are_read_as_kubernetes_defaults() -> None:
    """metadata.generation, labels and spec.replicas may be absent; the functions read them as their defaults."""
    svc = parse(shardingPolicy="FILE", workers={"replicas": 2})
    step = scaling.step(svc, {}, None, [], None, lambda n: [str(i) for i in range(n)], 0)
    assert (step.dispatcher_workers, step.worker_replicas) == (2, 0)
    started = {"metadata": {"name": "x-dispatcher-0", "labels": {"controller-revision-hash": "new"}},
               "status": {"containerStatuses": [{"started": True}]}}  # fmt: skip
    no_generation = {"metadata": {"name": "x-dispatcher"}, "status": {"observedGeneration": 1, "updateRevision": "new"}}
    assert scaling.started_on_current_revision(no_generation, [started])
    unlabelled = {"metadata": {"name": "x-dispatcher-0"}, "status": started["status"]}
    assert not scaling.started_on_current_revision(no_generation, [unlabelled])
    sts = {
        "metadata": {"name": "x-dispatcher", "uid": "sts-uid"},
        "status": {"currentRevision": "old", "updateRevision": "new", "replicas": 1, "updatedReplicas": 0},
    }
    assert (
        scaling.stuck_pods(sts, [{"metadata": {"name": "x-dispatcher-0", "ownerReferences": [{"uid": "sts-uid"}]}}])
        == []
    )


@pytest.mark.parametrize(
    ("statefulset", "expected"),
    [
        (None, False),
        ({"spec": {"replicas": 0}}, True),
        ({"spec": {"replicas": 2}}, False),
        ({"spec": {}}, False),  # replicas left out: Kubernetes' default, 1
        ({"metadata": {"name": "demo-worker"}}, False),  # no spec read yet
    ],
)
def test_only_a_statefulset_scaled_to_zero_is_suspended(statefulset: dict[str, Any] | None, expected: bool) -> None:
    assert scaling.suspended(statefulset) is expected
