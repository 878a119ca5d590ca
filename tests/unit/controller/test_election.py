"""The Lease elector's decisions, against an in-memory Lease that checks resourceVersions as the
API server does, on a fake clock: who leads, when a standby takes over, and that two candidates
never both may write."""

from __future__ import annotations

import copy
import threading
import time
from datetime import datetime, timezone
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from kubernetes.client.exceptions import ApiException

from tfdata_operator import cli
from tfdata_operator.controller import election
from tfdata_operator.controller.config import ElectionConfig, ElectionError, Timing
from tfdata_operator.controller.election import Elector, NotLeading

from fixtures.fakes import Clock
from fixtures.support import ROOT, wait_for

TIMING = Timing(lease_duration=10, renew_deadline=7, retry_period=2)


class MemoryLease:
    """One Lease, stored as the API server would: a replace with a stale resourceVersion is a 409."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.down = False  # the API server unreachable (for one candidate: see Partitioned)

    def get(self, timeout: float) -> dict[str, Any] | None:
        self._reachable()
        return copy.deepcopy(self.lease)

    def create(self, lease: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._reachable()
        if self.lease is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        return self._store(lease)

    def replace(self, lease: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._reachable()
        assert self.lease is not None
        if lease["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        return self._store(lease)

    def _store(self, lease: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.lease = copy.deepcopy(lease)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)

    def _reachable(self) -> None:
        if self.down:
            raise ConnectionError("connection refused")

    @property
    def holder(self) -> str:
        return str(((self.lease or {}).get("spec") or {}).get("holderIdentity") or "")


class Partitioned:
    """One candidate's view of the shared Lease, which it may lose (a network partition)."""

    def __init__(self, shared: MemoryLease) -> None:
        self.shared, self.cut = shared, False

    def get(self, timeout: float) -> dict[str, Any] | None:
        self._check()
        return self.shared.get(timeout)

    def create(self, lease: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._check()
        return self.shared.create(lease, timeout)

    def replace(self, lease: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._check()
        return self.shared.replace(lease, timeout)

    def _check(self) -> None:
        if self.cut:
            raise ConnectionError("no route to the API server")


def candidate(leases: Any, identity: str, clock: Clock, timing: Timing = TIMING) -> Elector:
    config = ElectionConfig(namespace="ops", name="tfdata-operator", identity=identity, timing=timing)
    return Elector(leases, config, clock=clock)


def step(elector: Elector) -> bool:
    """One pass of the loop as ``run`` does it: a try, and leading from the first success."""
    ok, _ = elector._try(1.0)
    if ok:
        elector.leading = True
    return ok


def test_the_first_candidate_creates_the_lease_and_leads_the_second_stands_by() -> None:
    clock, lease = Clock(), MemoryLease()
    a, b = candidate(lease, "a", clock), candidate(lease, "b", clock)
    assert step(a) and a.holds()
    assert lease.lease is not None
    spec = lease.lease["spec"]
    assert spec["holderIdentity"] == "a" and spec["leaseDurationSeconds"] == 10 and spec["leaseTransitions"] == 0
    assert spec["renewTime"].endswith("Z") and len(spec["renewTime"]) == len("2026-01-01T00:00:00.000000Z")
    assert not step(b) and not b.holds() and b.holder == "a"
    with pytest.raises(NotLeading, match="ops/tfdata-operator"), b.writing():
        pass
    clock.now += 2
    assert step(a), "the leader renews"
    assert lease.lease["spec"]["acquireTime"] == spec["acquireTime"], "a renewal keeps the acquire time"


def test_a_standby_takes_over_a_lease_duration_after_the_last_renewal_it_saw() -> None:
    clock, lease = Clock(), MemoryLease()
    a, b = candidate(lease, "a", clock), candidate(lease, "b", clock)
    assert step(a)
    assert not step(b)  # b sees a's Lease now
    clock.now += 2
    assert step(a)  # a's last renewal: b sees it change at its next read
    clock.now += 1
    assert not step(b)
    seen = clock.now
    # a is killed: nothing renews the Lease any more.
    while not step(b):
        clock.now += 2
        assert clock.now - seen <= 10 + 2, "b waited longer than the lease duration and one retry"
    assert clock.now - seen >= 10, "b took a Lease that had not expired"
    assert lease.holder == "b" and lease.lease is not None and lease.lease["spec"]["leaseTransitions"] == 1


def test_a_partitioned_leader_stops_writing_before_the_standby_may_take_over() -> None:
    """The safety property: at no instant may both write, even when the leader is alive but cut
    off from the API server (it cannot know that it lost)."""
    clock, shared = Clock(), MemoryLease()
    a_view = Partitioned(shared)
    a, b = candidate(a_view, "a", clock), candidate(shared, "b", clock)
    assert step(a)
    both, a_stopped, b_started = [], None, None
    a_view.cut = True  # from here a's renewals fail; it is not told why
    for tick in range(200):  # 20 s in 0.1 s steps; each candidate tries every retry period
        clock.now += 0.1
        if tick % 20 == 0:
            step(a)
        if tick % 20 == 7:
            step(b)
        if a.holds() and b.holds():
            both.append(clock.now)
        if a_stopped is None and not a.holds():
            a_stopped = clock.now
        if b_started is None and b.holds():
            b_started = clock.now
    assert not both, f"both may write at {both[:3]}"
    assert a_stopped is not None and b_started is not None
    assert b_started - a_stopped >= 10 - 7 - 0.2, "the margin between the renew deadline and the lease duration"
    with pytest.raises(NotLeading), a.writing():
        pass


def test_a_released_lease_is_taken_at_the_next_try() -> None:
    clock, lease = Clock(), MemoryLease()
    a, b = candidate(lease, "a", clock), candidate(lease, "b", clock)
    assert step(a)
    assert not step(b)
    a.release(wait=1)
    assert lease.holder == "" and not a.holds()
    assert step(b), "a released Lease needs no waiting"
    assert lease.holder == "b"


def test_release_waits_for_the_writes_in_flight_and_refuses_new_ones() -> None:
    clock, lease = Clock(), MemoryLease()
    a = candidate(lease, "a", clock)
    assert step(a)
    entered, finish = threading.Event(), threading.Event()

    def write() -> None:
        with a.writing():
            entered.set()
            finish.wait(5)

    writer = threading.Thread(target=write)
    writer.start()
    assert entered.wait(5)
    releaser = threading.Thread(target=a.release, args=(5,))
    releaser.start()
    # Once the release has begun (new writes are refused), it must wait for the one in flight: given
    # up to a second to end, it is still waiting, and the Lease still a's.
    wait_for(lambda: not a.holds(), 5, "the release to begin", interval=0.01)
    with pytest.raises(NotLeading), a.writing():
        pass
    releaser.join(1)
    assert releaser.is_alive() and lease.holder == "a", "released while a write was in flight"
    finish.set()
    writer.join(5)
    releaser.join(5)
    assert lease.holder == ""


def test_two_candidates_racing_for_a_free_lease_one_wins() -> None:
    clock, lease = Clock(), MemoryLease()
    a, b = candidate(lease, "a", clock), candidate(lease, "b", clock)
    assert step(a)
    a.release(wait=1)
    # Both read the free Lease; b writes first, a's write carries the older resourceVersion.
    stale = lease.get(1)
    assert step(b)
    lease_get = lease.get
    lease.get = lambda timeout: stale  # type: ignore[method-assign]
    assert not step(a), "a stale write must be refused"
    lease.get = lease_get  # type: ignore[method-assign]
    assert lease.holder == "b"


def _leading(lease: MemoryLease) -> tuple[Elector, list[str]]:
    """An elector with fast timings that leads on ``lease``, and the list its loss is reported to."""
    fast = Timing(lease_duration=1, renew_deadline=0.5, retry_period=0.05)
    a = Elector(lease, ElectionConfig(namespace="ops", name="l", identity="a", timing=fast))
    started, lost = threading.Event(), []
    a.start(started.set, lost.append)
    assert started.wait(5) and a.holds()
    return a, lost


def _wait_lost(lost: list[str], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not lost and time.monotonic() < deadline:
        time.sleep(0.01)


def test_the_loop_reports_a_lost_lease_at_once_when_another_holds_it() -> None:
    lease = MemoryLease()
    a, lost = _leading(lease)
    assert lease.lease is not None
    lease.lease["spec"]["holderIdentity"] = "intruder"
    _wait_lost(lost)
    assert lost and "intruder" in lost[0], lost
    assert not a.holds()
    a.stop(wait=1)
    assert lease.holder == "intruder", "a lost Lease is not released"


def test_the_loop_loses_the_lease_once_the_renew_deadline_passes() -> None:
    lease = MemoryLease()
    a, lost = _leading(lease)
    lease.down = True
    cut = time.monotonic()
    _wait_lost(lost)
    assert lost and "connection refused" in lost[0], lost
    assert time.monotonic() - cut < 1, "lost later than the lease duration"
    a.stop(wait=1)


@pytest.mark.parametrize(
    ("timing", "message"),
    [
        ((10, 12, 2), "lease duration (10 s) must be above the renew deadline (12"),
        ((10, 2, 2), "renew deadline (2 s) must be above 1.2 times the retry period"),
        ((10, 7, 0), "retry period must be above 0"),
    ],
)
def test_timings_that_cannot_work_are_refused_naming_the_rule(timing: tuple[int, float, float], message: str) -> None:
    with pytest.raises(ElectionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Timing(*timing)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--leader-election", "--leader-election-namespace=ops", "--renew-deadline=12"], "--renew-deadline"),
        (["--leader-election"], "--leader-election-namespace"),
    ],
)
def test_the_cli_refuses_an_election_that_cannot_work(
    args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(election, "IN_CLUSTER_NAMESPACE", election.Path("/nonexistent/namespace"))
    result = CliRunner().invoke(cli.main, ["run", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_micro_time_always_has_six_fraction_digits() -> None:
    assert election.micro_time(datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)) == "2026-01-02T03:04:05.000000Z"


def test_the_charts_default_timings_are_the_operators() -> None:
    """One set of defaults: a user reading values.yaml or `run --help` sees the same numbers."""
    values = yaml.safe_load((ROOT / "charts/tfdata-operator/values.yaml").read_text())["leaderElection"]
    chart = (values["leaseDurationSeconds"], values["renewDeadlineSeconds"], values["retryPeriodSeconds"])
    timing = Timing()
    assert chart == (timing.lease_duration, timing.renew_deadline, timing.retry_period)
