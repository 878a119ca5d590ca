"""The TFData autoscaler's decision: tables of readings in, a worker count and its reason out."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from tfdata_operator.autoscaling import policy as autoscaler
from tfdata_operator.autoscaling.policy import History, LastScale, Policy, Sample, ScaleDecision

from fixtures.cases import parse

NOW = 10_000.0
WHEN_IDLE = Policy(
    min_replicas=1, max_replicas=8, scale_down_always=False, window_seconds=60, saturated_cpu=0.8, stalled=0.1
)
ALWAYS = replace(WHEN_IDLE, scale_down_always=True)


def reading(
    at: float,
    cpu: float | None = 0.5,
    stall: float | None = None,
    reading: bool = True,
    idle: float = 0.0,
    answering: int = 2,
    rate: float | None = None,
) -> Sample:
    return Sample(
        at=at,
        reading=reading,
        idle_seconds=idle,
        workers_answering=answering,
        cpu_mean=cpu,
        stall_mean=stall,
        reporting_clients=0 if stall is None else 1,
        rate=rate,
    )


def steady(seconds: float = 120, every: float = 5, until: float = NOW, **values: Any) -> list[Sample]:
    """The same reading every ``every`` seconds for the last ``seconds``."""
    count = int(seconds // every) + 1
    return [reading(until - (count - 1 - i) * every, **values) for i in range(count)]


@dataclass(frozen=True)
class Case:
    id: str
    samples: list[Sample]
    current: int = 2
    policy: Policy = WHEN_IDLE
    replicas: int | None = None  # None: the count stays
    says: str = ""


CASES = [
    Case(
        "saturated and stalled: add, sized from the trainers' stall",
        steady(stall=0.38, cpu=0.95),
        replicas=4,  # 2 / (1 - 0.38) = 3.2
        says="trainers waited on data 38% of the time, workers at 95% CPU",
    ),
    Case(
        "stalled but the workers idle (waiting on storage): a trial step",
        steady(stall=0.40, cpu=0.20),
        replicas=4,  # 2 / (1 - 0.4) = 3.3
        says="trainers waited on data 40% of the time, workers at 20% CPU: waiting on input, not CPU; trying 4",
    ),
    Case(
        "an I/O-bound trainer that only waits: a trial step of a doubling",
        steady(stall=1.0, cpu=0.05),
        current=1,
        replicas=2,
        says="trying 2 (kept if the trainers read faster)",
    ),
    Case("saturated but the trainers are fed: do not add", steady(stall=0.02, cpu=0.95), says="the trainers are fed"),
    Case(
        "plain distribute() trainers report nothing: saturated workers alone add",
        steady(cpu=0.95),
        replicas=3,
        says="workers at 95% CPU (no trainer reports its data stalls)",
    ),
    Case("plain trainers, workers below the target: hold", steady(cpu=0.6), says="below the 80% target"),
    Case("a step is at most a doubling", steady(stall=0.9, cpu=1.0), current=3, replicas=6),
    Case("a step is at least one worker", steady(stall=0.11, cpu=0.81), current=4, replicas=5),
    Case("clamped to maxReplicas", steady(stall=0.6, cpu=1.0), current=6, replicas=8),
    Case("at maxReplicas: hold", steady(stall=0.6, cpu=1.0), current=8, says="already at maxReplicas 8"),
    Case("above maxReplicas: clamped at once", steady(cpu=0.5), current=12, replicas=8, says="outside minReplicas"),
    Case(
        "below minReplicas: clamped at once",
        steady(cpu=0.5),
        current=1,
        policy=replace(WHEN_IDLE, min_replicas=3),
        replicas=3,
    ),
    Case("one reading is not evidence", steady(seconds=0, stall=0.5, cpu=1.0), says="trainers waited"),
    Case("evidence must hold for the whole up window", [*steady(stall=0.5, cpu=1.0)[:-1], reading(NOW, cpu=0.3)]),
    Case(
        "WhenIdle holds scale-down while clients read",
        steady(stall=0.01, cpu=0.1),
        current=4,
        says="scaleDown WhenIdle removes workers only once no client reads",
    ),
    Case(
        "Always removes idle workers while clients read, at most half",
        steady(stall=0.01, cpu=0.1, answering=4),
        current=4,
        policy=ALWAYS,
        replicas=2,
        says="scaleDown Always",
    ),
    Case(
        "Always keeps idle workers while the trainers still wait a little (hysteresis)",
        steady(stall=0.07, cpu=0.1, answering=4),
        current=4,
        policy=ALWAYS,
        says="trainers waited on data 7% of the time, workers at 10% CPU: the trainers are fed",
    ),
    Case(
        "Always waits for the whole stabilization window",
        steady(seconds=40, stall=0.01, cpu=0.1, answering=4),
        current=4,
        policy=ALWAYS,
        says="once that holds for 60s",
    ),
    Case(
        "Always keeps what the busiest moment needed",
        steady(cpu=0.35, answering=8)[:-3] + steady(seconds=10, cpu=0.05, answering=8),
        current=8,
        policy=ALWAYS,
        replicas=5,  # 8 x 0.35 = 2.8 workers' CPU, at 70% of the 80% target: 5
    ),
    Case(
        "nobody reads for the window: back to minReplicas",
        steady(reading=False, idle=70, cpu=0.0),
        current=4,
        replicas=1,
        says="no client has read for 70s",
    ),
    Case(
        "nobody reads, but not for the window yet",
        steady(reading=False, idle=30, cpu=0.0),
        current=4,
        says="removing workers after 60s",
    ),
    Case("nobody reads at minReplicas", steady(reading=False, idle=900, cpu=0.0), current=1, says="no client reads"),
    Case(
        "stale signals: hold",
        steady(until=NOW - 60, stall=0.5, cpu=1.0),
        says="no recent signals from the dispatcher (last read 60s ago)",
    ),
    Case("no signals at all: hold", [], says="none read yet"),
    Case("no worker reported its CPU: hold", steady(cpu=None, stall=0.5), says="no worker reported its CPU"),
]


def settled(replicas: int) -> History:
    """A count the autoscaler has known for an hour."""
    return History(LastScale(NOW - 3600, replicas, replicas, load_driven=False))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_one_decision(case: Case) -> None:
    decision = autoscaler.decide(case.policy, case.current, case.samples, settled(case.current), NOW)
    assert decision.replicas == (case.current if case.replicas is None else case.replicas), decision.reason
    assert case.says in decision.reason
    assert decision.scales == (decision.replicas != case.current)
    assert 1.0 <= decision.next_check_seconds <= autoscaler.QUIET_CHECK_SECONDS


def test_the_first_decision_waits_for_readings_that_describe_the_count() -> None:
    # The operator just started, or autoscaling was just turned on: the count may have just changed.
    first = autoscaler.decide(WHEN_IDLE, 2, steady(stall=0.5, cpu=1.0), History(), NOW)
    assert (first.replicas, first.reason) == (2, "gathering signals for 2 workers")
    assert first.history.last == LastScale(NOW, 2, 2, load_driven=False)
    later = steady(until=NOW + 30, stall=0.5, cpu=1.0)
    assert autoscaler.decide(WHEN_IDLE, 2, later, first.history, NOW + 30).replicas == 4
    # Nobody reading is known from the dispatcher's own idle time: no wait.
    idle = steady(reading=False, idle=900)
    assert autoscaler.decide(WHEN_IDLE, 3, idle, History(), NOW).replicas == 1


def test_a_quiet_service_is_checked_less_often_and_the_wait_ends_with_the_window() -> None:
    at_min = autoscaler.decide(WHEN_IDLE, 1, steady(reading=False, idle=900), History(), NOW)
    assert at_min.next_check_seconds == autoscaler.QUIET_CHECK_SECONDS
    almost = autoscaler.decide(WHEN_IDLE, 3, steady(reading=False, idle=57), History(), NOW)
    assert almost.next_check_seconds == pytest.approx(3.0)


# --- After a scale ----------------------------------------------------------------------------


def after_scale_up(before: dict[str, Any], after: dict[str, Any], answering: int = 4) -> list[Sample]:
    """Readings before a 2 -> 4 scale at NOW - 100, then with 4 workers answering."""
    return steady(60, until=NOW - 101, **before) + steady(95, until=NOW, answering=answering, **after)


SCALED_UP = History(LastScale(NOW - 100, 2, 4))


def test_adding_that_helped_goes_on() -> None:
    samples = after_scale_up({"stall": 0.40, "cpu": 0.95}, {"stall": 0.20, "cpu": 0.95})
    decision = autoscaler.decide(WHEN_IDLE, 4, samples, SCALED_UP, NOW)
    assert decision.replicas == 5  # 4 / (1 - 0.2)
    assert decision.history.last == LastScale(NOW, 4, 5)


def test_adding_that_stopped_helping_stops() -> None:
    samples = after_scale_up({"stall": 0.40, "cpu": 0.95}, {"stall": 0.39, "cpu": 0.95})
    first = autoscaler.decide(WHEN_IDLE, 4, samples, SCALED_UP, NOW)
    assert (first.replicas, first.history.plateau is not None) == (4, True)
    assert "adding workers stopped helping: from 2 to 4 workers, the trainers' wait went from 40% to 39%" in (
        first.reason
    )
    # Later readings of the same load hold at the plateau ...
    later = after_scale_up({"stall": 0.40, "cpu": 0.95}, {"stall": 0.41, "cpu": 0.95})
    assert autoscaler.decide(WHEN_IDLE, 4, later, first.history, NOW + 5).replicas == 4
    # ... until the load grows (another trainer) or the plateau ages out.
    grown = after_scale_up({"stall": 0.40, "cpu": 0.95}, {"stall": 0.55, "cpu": 0.95})
    assert autoscaler.decide(WHEN_IDLE, 4, grown, first.history, NOW + 5).replicas == 8
    aged = NOW + autoscaler.PLATEAU_SECONDS
    shifted = [replace(s, at=s.at + autoscaler.PLATEAU_SECONDS) for s in later]
    assert autoscaler.decide(WHEN_IDLE, 4, shifted, first.history, aged).replicas > 4


def test_without_reports_helping_is_judged_by_the_workers_busy_cpu() -> None:
    # 2 workers at 95% gave 1.9 workers' worth; 4 at 50% give 2.0: the extra two add nothing.
    flat = after_scale_up({"cpu": 0.95}, {"cpu": 0.85})
    decision = autoscaler.decide(WHEN_IDLE, 4, flat, SCALED_UP, NOW)
    assert decision.replicas == 5  # 3.4 workers' worth from 1.9: it helped
    stuck = after_scale_up({"cpu": 1.0}, {"cpu": 0.81}, answering=4)
    before = steady(60, until=NOW - 101, cpu=1.0, answering=4)  # 4.0 before, 3.24 after
    decision = autoscaler.decide(WHEN_IDLE, 4, before + stuck[len(before) :], SCALED_UP, NOW)
    assert decision.replicas == 4 and "their busy CPU went from 4.00 to only 3.24" in decision.reason


def test_new_workers_must_answer_before_their_readings_count() -> None:
    # Still saturated and stalled, but only 2 of the 4 workers answer yet: the old readings
    # describe 2 workers, so adding more now would overshoot.
    samples = after_scale_up({"stall": 0.4, "cpu": 1.0}, {"stall": 0.4, "cpu": 1.0}, answering=2)
    decision = autoscaler.decide(WHEN_IDLE, 4, samples, SCALED_UP, NOW)
    assert decision.replicas == 4 and "waiting for the new workers to answer the dispatcher (2 of 4)" in decision.reason
    # Workers that never come up stop holding decisions back after the warm-up timeout.
    late = NOW - autoscaler.WARMUP_TIMEOUT_SECONDS - 1
    stuck = autoscaler.decide(WHEN_IDLE, 4, samples, History(LastScale(late, 2, 4)), NOW)
    assert "waiting for the new workers" not in stuck.reason


def test_readings_settle_after_the_new_workers_answer() -> None:
    # All 4 answer only since 10 s ago: their CPU and the trainers' reports still average the old count.
    samples = steady(90, until=NOW - 11, stall=0.4, cpu=1.0) + steady(10, stall=0.4, cpu=1.0, answering=4)
    decision = autoscaler.decide(WHEN_IDLE, 4, samples, History(LastScale(NOW - 100, 2, 4)), NOW)
    assert decision.replicas == 4


def test_own_scale_not_yet_observed_is_not_taken_for_a_user_change() -> None:
    history = History(LastScale(NOW - 2, 2, 4))
    decision = autoscaler.decide(WHEN_IDLE, 2, steady(stall=0.4, cpu=1.0), history, NOW)
    assert (decision.replicas, decision.history) == (2, history)
    assert "to be observed" in decision.reason


def test_kubectl_scale_is_the_new_starting_point() -> None:
    history = History(LastScale(NOW - 600, 2, 4))
    # The user set 7 while nothing asks for it (trainers fed, workers idle): kept, not undone at once.
    idle_workers = steady(stall=0.01, cpu=0.1, answering=7)
    first = autoscaler.decide(ALWAYS, 7, idle_workers, history, NOW)
    assert first.replicas == 7 and "set outside the autoscaler" in first.reason
    assert first.history.last == LastScale(NOW, 4, 7, load_driven=False)
    # Readings from before the change do not count; after the window they do.
    assert autoscaler.decide(ALWAYS, 7, idle_workers, first.history, NOW + 30).replicas == 7
    later = steady(120, until=NOW + 90, stall=0.01, cpu=0.1, answering=7)
    assert autoscaler.decide(ALWAYS, 7, later, first.history, NOW + 90).replicas == 4


# --- I/O-bound trainers: steps taken while the workers' CPU is low are trials ------------------------


def trial_history(frm: int = 2, to: int = 4, floor: int | None = 4) -> History:
    return History(LastScale(NOW - 100, frm, to, trial=True), floor=floor)


def test_a_trial_that_made_the_trainers_faster_goes_on() -> None:
    # The trainers wait all the time before and after (1 - stall compares nothing); their rate doubled.
    samples = after_scale_up({"stall": 1.0, "cpu": 0.1, "rate": 50.0}, {"stall": 1.0, "cpu": 0.1, "rate": 99.0})
    decision = autoscaler.decide(ALWAYS, 4, samples, trial_history(), NOW)
    assert decision.replicas == 8, decision.reason
    assert decision.history.last == LastScale(NOW, 4, 8, trial=True)
    assert decision.history.floor == 8


@pytest.mark.parametrize("rate", [50.0, None], ids=["rate flat", "no rate, stall stuck at 100%"])
def test_a_trial_that_did_not_help_is_undone_under_always_and_not_retried(rate: float | None) -> None:
    samples = after_scale_up({"stall": 1.0, "cpu": 0.1, "rate": 50.0}, {"stall": 1.0, "cpu": 0.05, "rate": rate})
    undone = autoscaler.decide(ALWAYS, 4, samples, trial_history(floor=4), NOW)
    assert undone.replicas == 2, undone.reason
    found = (
        "the trainers read 50.0 then 50.0 elements/s"
        if rate
        else "the trainers' wait went from 100% to 100% of the time"
    )
    assert f"more workers did not help: from 2 to 4 workers, {found}; back to 2" in undone.reason
    assert undone.history.plateau is not None and undone.history.plateau.replicas == 2
    assert undone.history.floor == 2
    # The same load at 2 holds: the trial is not repeated ...
    later = steady(60, until=NOW + 60, stall=1.0, cpu=0.12, rate=50.0)
    again = autoscaler.decide(ALWAYS, 2, later, undone.history, NOW + 60)
    assert again.replicas == 2 and "adding workers stopped helping at 2" in again.reason
    # ... not even when the workers' low CPU wobbles by more than a quarter ...
    busier = steady(60, until=NOW + 60, stall=1.0, cpu=0.3, rate=50.0)
    assert autoscaler.decide(ALWAYS, 2, busier, undone.history, NOW + 60).replicas == 2
    # ... until another trainer reports, or the plateau ages out.
    two = [replace(s, reporting_clients=2) for s in later]
    assert autoscaler.decide(ALWAYS, 2, two, undone.history, NOW + 60).replicas == 4


def test_a_trial_that_did_not_help_stays_under_when_idle_until_nobody_reads() -> None:
    samples = after_scale_up({"stall": 1.0, "cpu": 0.1, "rate": 50.0}, {"stall": 1.0, "cpu": 0.05, "rate": 51.0})
    kept = autoscaler.decide(WHEN_IDLE, 4, samples, trial_history(), NOW)
    assert kept.replicas == 4 and "scaleDown WhenIdle keeps them until no client reads" in kept.reason
    assert kept.history.plateau is not None and kept.history.plateau.replicas == 4


def test_a_kept_step_judged_before_its_workers_served_is_judged_again() -> None:
    # Judged while the new workers had not yet started serving the trainers' job (a loaded node):
    # the rate had not moved. The workers stay (WhenIdle), and so does the rate before the step.
    samples = after_scale_up({"stall": 1.0, "cpu": 0.1, "rate": 50.0}, {"stall": 1.0, "cpu": 0.05, "rate": 51.0})
    kept = autoscaler.decide(WHEN_IDLE, 4, samples, trial_history(), NOW)
    assert kept.history.plateau is not None and kept.history.plateau.before == (2, 50.0), kept.history
    # A wobble at the kept count (a fifth faster: less than half of what 2 more workers could give) holds ...
    wobble = steady(60, until=NOW + 60, stall=1.0, cpu=0.05, answering=4, rate=60.0)
    held = autoscaler.decide(WHEN_IDLE, 4, wobble, kept.history, NOW + 60)
    assert held.replicas == 4 and "adding workers stopped helping at 4" in held.reason
    # ... the trainers reading twice as fast there shows the step helped: the plateau ends, adding goes on.
    served = steady(60, until=NOW + 60, stall=1.0, cpu=0.05, answering=4, rate=99.0)
    going_on = autoscaler.decide(WHEN_IDLE, 4, served, kept.history, NOW + 60)
    assert going_on.replicas == 8, going_on.reason
    assert "the step from 2 to 4 workers helped after all (50.0 then 99.0 elements/s)" in going_on.reason
    assert going_on.history.plateau is None and going_on.history.last == LastScale(NOW + 60, 4, 8, trial=True)


def test_an_undone_step_is_not_judged_again() -> None:
    # Under Always the trial's workers went: readings at the count before it cannot judge it.
    samples = after_scale_up({"stall": 1.0, "cpu": 0.1, "rate": 50.0}, {"stall": 1.0, "cpu": 0.05, "rate": 50.0})
    undone = autoscaler.decide(ALWAYS, 4, samples, trial_history(), NOW)
    assert undone.replicas == 2 and undone.history.plateau is not None and undone.history.plateau.before is None
    faster = steady(60, until=NOW + 60, stall=1.0, cpu=0.12, rate=99.0)
    assert autoscaler.decide(ALWAYS, 2, faster, undone.history, NOW + 60).replicas == 2


def test_the_trainers_rate_judges_a_step_before_their_stall() -> None:
    # Stall fell from 40% to 20% (a 33% speedup) but the elements read per second did not move:
    # another trainer's reports, not the step, changed the mean stall.
    samples = after_scale_up({"stall": 0.4, "cpu": 0.95, "rate": 80.0}, {"stall": 0.2, "cpu": 0.95, "rate": 80.5})
    decision = autoscaler.decide(WHEN_IDLE, 4, samples, SCALED_UP, NOW)
    assert decision.replicas == 4 and "the trainers read 80.0 then 80.5 elements/s" in decision.reason


def test_always_keeps_the_workers_a_trial_brought_while_clients_read() -> None:
    # After the trial the trainers are fed and the workers idle: SPARE for the whole window. The
    # workers' CPU would size 4 -> 2, which stalls the trainers and brings the trial back.
    fed = steady(stall=0.01, cpu=0.05, answering=4, rate=99.0)
    kept = autoscaler.decide(ALWAYS, 4, fed, settled_with_floor(4, 4), NOW)
    assert kept.replicas == 4 and "keeping the 4 workers that made the trainers read faster" in kept.reason
    # Above the floor the usual rule applies, down to the floor at most.
    fed_8 = steady(stall=0.01, cpu=0.05, answering=8)
    assert autoscaler.decide(ALWAYS, 8, fed_8, settled_with_floor(8, 3), NOW).replicas == 4
    assert autoscaler.decide(ALWAYS, 8, fed_8, settled_with_floor(8, 6), NOW).replicas == 6
    # Once nobody reads, the floor is forgotten: the workers go after the window, as always.
    idle = autoscaler.decide(ALWAYS, 4, steady(reading=False, idle=70, cpu=0.0), settled_with_floor(4, 4), NOW)
    assert idle.replicas == 1 and idle.history.floor is None


def settled_with_floor(replicas: int, floor: int) -> History:
    return replace(settled(replicas), floor=floor)


# --- Closed loops: a toy service that answers the decisions ---------------------------------------


@dataclass
class ToyService:
    """Workers that each give one unit of CPU; the trainers want ``demand`` units.

    A worker counts as answering 10 s after it is added. ``reports`` is False for plain
    distribute() trainers.
    """

    demand: Callable[[float], float]
    reports: bool = True
    workers: int = 1
    added_at: float = -1e9
    idle_since: float | None = None
    # I/O-bound: a worker's unit of data costs this share of its CPU, and the service gives at most
    # ``cap`` units whatever the count (a network or storage limit). Elements/s = 25 per unit.
    cpu_per_unit: float = 1.0
    cap: float = float("inf")

    def read(self, at: float) -> Sample:
        demand = self.demand(at)
        answering = self.workers if at - self.added_at >= 10 else max(1, self.workers // 2)
        if demand <= 0:
            self.idle_since = at if self.idle_since is None else self.idle_since
            return reading(at, cpu=0.0, reading=False, idle=at - self.idle_since, answering=answering)
        self.idle_since = None
        served = min(demand, answering, self.cap)
        cpu = min(1.0, served / answering * self.cpu_per_unit)
        stall = max(0.02, 1 - served / demand) if self.reports else None
        rate = 25 * served if self.reports else None
        return reading(at, cpu=cpu, stall=stall, answering=answering, rate=rate)


def run(service: ToyService, policy: Policy, seconds: float, log: list[float] | None = None) -> list[ScaleDecision]:
    """Reads and decides at the pace the decisions ask for; ``log`` gets each scale's time."""
    samples: list[Sample] = []
    history = History()
    decisions = []
    at = 0.0
    while at < seconds:
        samples.append(service.read(at))
        decision = autoscaler.decide(policy, service.workers, samples[-200:], history, at)
        decisions.append(decision)
        if decision.scales and log is not None:
            log.append(at)
        history = decision.history
        if decision.replicas > service.workers:
            service.added_at = at
        service.workers = decision.replicas
        at += decision.next_check_seconds
    return decisions


def directions(decisions: list[ScaleDecision]) -> list[int]:
    """+1 for every scale-up, -1 for every scale-down, in order."""
    return [1 if d.replicas > d.current else -1 for d in decisions if d.scales]


@pytest.mark.parametrize("reports", [True, False], ids=["reporting trainers", "plain trainers"])
def test_a_load_is_met_quickly_then_released_once_it_ends(reports: bool) -> None:
    service = ToyService(lambda t: 3.5 if t < 300 else 0.0, reports=reports)
    times: list[float] = []
    decisions = run(service, replace(WHEN_IDLE, max_replicas=8), 600, times)
    during = [d for d in decisions if d.scales and d.replicas > d.current]
    if reports:
        # The trainers' stall says how far to go: 1 -> 2 (at most a doubling) -> 4, where they are fed.
        assert [d.replicas for d in during] == [2, 4]
    else:
        # Saturated workers only say "more": one step per settled reading, up to the 80% CPU target.
        assert [d.replicas for d in during] == [2, 3, 4, 5]
    # Each step waits for the new workers (10 s here), the settling time and the evidence window;
    # the first, for the settling time and the evidence.
    first = autoscaler.SETTLE_SECONDS + autoscaler.UP_WINDOW_SECONDS
    settle = 10 + first
    assert times[len(during) - 1] <= first + (len(during) - 1) * settle
    # Once nobody reads, the window passes and every worker but minReplicas goes, at once.
    assert directions(decisions) == [1] * len(during) + [-1]
    assert service.workers == 1
    assert 300 + WHEN_IDLE.window_seconds <= times[-1] <= 300 + WHEN_IDLE.window_seconds + 15


def test_flapping_input_never_oscillates() -> None:
    # Every other reading says "add" (stalled, saturated), the rest "spare" (fed, idle).
    flapping = ToyService(lambda t: 4.0 if int(t // 5) % 2 else 0.3, workers=2)
    verdicts = {autoscaler.assess(flapping.read(t), WHEN_IDLE)[0] for t in (0.0, 5.0)}
    assert verdicts == {autoscaler.Verdict.ADD, autoscaler.Verdict.SPARE}
    for policy in (WHEN_IDLE, ALWAYS):
        flapping.workers = 2
        decisions = run(flapping, policy, 900)
        assert directions(decisions) == [], [d.reason for d in decisions if d.scales]


def test_a_slowly_changing_load_changes_direction_once() -> None:
    ramp = ToyService(lambda t: 4.0 if t < 600 else 0.8, workers=1)
    decisions = run(ramp, ALWAYS, 1500)
    steps = directions(decisions)
    assert steps[0] == 1 and steps[-1] == -1
    assert sum(1 for a, b in itertools.pairwise(steps) if a != b) == 1


@pytest.mark.parametrize("policy", [WHEN_IDLE, ALWAYS], ids=["WhenIdle", "Always"])
def test_an_io_bound_load_is_met_and_kept_without_oscillating(policy: Policy) -> None:
    # Workers at 5% CPU per unit of data: the CPU never asks for more, the trainers' stall does.
    service = ToyService(lambda t: 3.5 if t < 900 else 0.0, cpu_per_unit=0.05)
    decisions = run(service, policy, 1200)
    assert [d.replicas for d in decisions if d.scales][:2] == [2, 4]
    assert directions(decisions) == [1, 1, -1], [d.reason for d in decisions if d.scales]
    assert service.workers == 1


def test_an_io_bound_load_capped_elsewhere_tries_once_per_plateau() -> None:
    # The storage gives one worker's worth whatever the count: each trial is undone.
    service = ToyService(lambda t: 3.5, cpu_per_unit=0.05, cap=1.0)
    times: list[float] = []
    decisions = run(service, ALWAYS, autoscaler.PLATEAU_SECONDS * 2 + 60, times)
    assert directions(decisions) == [1, -1] * 2, [d.reason for d in decisions if d.scales]
    assert service.workers == 1
    # A trial is undone within a minute, and the next one waits for the plateau to age out.
    ups, downs = times[::2], times[1::2]
    assert all(down - up < 60 for up, down in zip(ups, downs, strict=True))
    assert all(up - down >= autoscaler.PLATEAU_SECONDS for down, up in itertools.pairwise(times[1:]) if up in ups)
    assert "more workers did not help: from 1 to 2 workers, the trainers read 25.0 then 25.0 elements/s" in (
        next(d.reason for d in decisions if d.scales and d.replicas < d.current)
    )


def test_scale_to_zero_and_back_at_the_first_client() -> None:
    zero = replace(WHEN_IDLE, min_replicas=0)
    # Nobody reads for the window: every worker goes.
    gone = autoscaler.decide(zero, 2, steady(reading=False, idle=70, cpu=0.0), settled(2), NOW)
    assert (gone.replicas, gone.reason) == (0, "no client has read for 70s")
    # At zero, the dispatcher is read often, so that the first client waits little.
    waiting = autoscaler.decide(zero, 0, steady(reading=False, idle=900, cpu=None, answering=0), gone.history, NOW)
    assert (waiting.replicas, waiting.reason) == (0, "no client reads; scaled to zero")
    assert waiting.next_check_seconds == autoscaler.CHECK_SECONDS
    # One reading that says a client reads (its journal names it; no worker, so no CPU) is enough.
    attached = [*steady(reading=False, idle=900, cpu=None, answering=0), reading(NOW + 5, cpu=None, answering=0)]
    back = autoscaler.decide(zero, 0, attached, waiting.history, NOW + 5)
    assert back.replicas == 1 and back.reason == "a client is reading and no worker runs (scaled to zero)"
    # From one worker on, the evidence decides as always.
    loaded = steady(60, until=NOW + 60, stall=0.5, cpu=0.9, answering=1)
    assert autoscaler.decide(zero, 1, loaded, back.history, NOW + 60).replicas == 2


def test_the_policy_comes_from_the_spec() -> None:
    svc = parse(
        shardingPolicy="DYNAMIC",
        autoscaling={"maxReplicas": 6, "scaleDown": "Always", "targetDataStallPercentage": 20},
    )
    assert svc.autoscaling is not None
    assert Policy.of(svc.autoscaling) == Policy(
        min_replicas=1, max_replicas=6, scale_down_always=True, window_seconds=300, saturated_cpu=0.8, stalled=0.2
    )
