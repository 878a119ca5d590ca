"""The worker count for ``spec.autoscaling.metric: TFData``: a pure decision from the dispatcher's signals.

The operator reads the dispatcher's ``/v1/signals`` every few seconds (``signalsource``) and
keeps the recent readings; ``decide`` turns them, the current count and what the last scale
was, into the count to write to ``spec.workers.replicas``, a reason a person can read, and when
to look again. No I/O and no clock: the caller passes ``now`` (wall-clock seconds, as the
samples' times), so the unit tests replay any history.

The policy, in the spirit of Cachew (USENIX ATC'22: scale on what the trainers see, add while it
helps) and of Flink's autoscaler (size the step from the measured load, stabilize before scaling
down):

- Every reading is classified: ADD (trainers stall; with no trainer reporting, saturated workers
  alone), SPARE (trainers fed and workers idle, both below half of their targets), or a reason to
  hold. The gap between the targets and their halves is the hysteresis. Stalled trainers ask for
  workers whatever the workers' CPU: a pipeline that waits on storage (an I/O-bound one) leaves
  its workers idle and still reads faster from more of them. Such a step, taken while the workers
  are below the CPU target, is a *trial*: it stays only if the trainers read faster.
- Add workers when every reading of the last ``UP_WINDOW_SECONDS`` says ADD. The step is sized
  from the load (a trainer that waits a fraction s of the time needs 1/(1-s) times the data rate;
  saturated workers need their CPU over the target): at least one worker, at most double.
- Readings count only once they describe the current count: after a scale-up, once every new
  worker answers the dispatcher, plus ``SETTLE_SECONDS`` (the workers' CPU and the trainers'
  reports are averaged over 10 s).
- Stop adding when adding stops helping: before adding again, compare the readings before the
  last scale-up with those after it. The trainers' speed must have risen by ``MIN_SPEEDUP``:
  the elements per second they read in all, or, from trainers that do not send it, 1 - stall
  (which cannot move for an I/O-bound trainer that waits all the time, only faster); with no
  trainer reporting, the workers' total busy CPU (a throughput proxy) by half of what the added
  workers could give. If not, hold at this count (a plateau) until the load grows or
  ``PLATEAU_SECONDS`` pass; a trial that did not help is undone, and the plateau is the count
  before it. Where such a step's workers stay (``scaleDown: WhenIdle``), later readings can still
  end the plateau: a rate at least half of what the added workers could give above the one before
  the step (the first judgement can come before a slow node's new worker serves the trainers).
- Remove workers slowly: with ``scaleDown: WhenIdle`` only once no client has read for the
  stabilization window (then straight to minReplicas: nothing is read, so nothing is lost);
  with ``Always`` also while clients read, when every reading of the whole window says SPARE,
  to what the busiest moment of the window needed, at most halving. The workers' CPU cannot say
  how many an I/O-bound pipeline needs, so the count a trial reached stays while clients read
  (otherwise every removal would stall the trainers and bring the trial back).
- A count set outside the autoscaler (``kubectl scale``) is the new starting point: it is kept
  until the readings after it say otherwise. A count outside min/max is clamped at once.
- Scale to zero (``minReplicas: 0``): once nobody reads for the window, the workers go to 0 like to
  any minReplicas; at zero the dispatcher is read every ``CHECK_SECONDS``, and the first reading
  that says a client reads (its journal names an attached client) brings one worker at once,
  without evidence windows: that client waits for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

from tfdata_operator.api.spec import SCALE_DOWN_ALWAYS, AutoscalingSpec
from tfdata_operator.wire.signals import ServiceSignals

# After a scale, readings describe the new count only this long after every worker answers: the
# workers' CPU is a 10 s average that the dispatcher reads every 2 s (a trainer's report covers
# its last 10 s too). Longer only delays the next step: the up window below is the evidence.
SETTLE_SECONDS = 12.0
# New workers that do not all answer within this long (an image pull, a node that is full)
# no longer hold decisions back.
WARMUP_TIMEOUT_SECONDS = 180.0
# Every reading this recent must say ADD (and they must span half of it) before workers are added:
# at least two readings of 10 s averages, so one busy moment never adds a worker.
UP_WINDOW_SECONDS = 10.0
# Without a reading this recent the autoscaler holds (the dispatcher is down or unreachable).
MAX_SAMPLE_AGE_SECONDS = 30.0
# How often to read while something can change, and while nothing reads.
CHECK_SECONDS = 5.0
QUIET_CHECK_SECONDS = 15.0
# "Adding helped": the trainers' speed rose by this much, or the workers' busy CPU by this share
# of what the added workers could give.
MIN_SPEEDUP = 0.05
MIN_SCALING_EFFICIENCY = 0.5
# A plateau ends when the trainers' stall rises by this much (absolute), the workers' busy CPU by
# this factor, or after this long.
PLATEAU_STALL_RISE = 0.10
PLATEAU_BUSY_RISE = 1.25
PLATEAU_SECONDS = 600.0
# Removing workers while clients read aims the rest at this share of the CPU target, well inside
# the hysteresis band, so the next reading does not ask for them back.
DOWN_TO_UTILIZATION = 0.7
# A stall this close to 1 gives no useful step size: the step is capped at doubling anyway.
_MAX_STALL_FOR_STEP = 0.9


@dataclass(frozen=True, slots=True)
class Sample:
    """The numbers of one ``ServiceSignals`` reading the policy uses, and when it was read.

    Kept instead of the whole document: a window holds minutes of readings per service.
    """

    at: float
    reading: bool
    idle_seconds: float
    workers_answering: int
    cpu_mean: float | None
    stall_mean: float | None  # None when no client reports
    reporting_clients: int
    rate: float | None = None  # elements per second the reporting clients read in all; None: unknown

    @classmethod
    def of(cls, at: float, s: ServiceSignals) -> Sample:
        return cls(
            at=at,
            reading=s.reading,
            idle_seconds=s.idle_seconds,
            workers_answering=s.workers_answering,
            cpu_mean=s.worker_cpu_utilization_mean,
            stall_mean=s.client_stall_fraction_mean if s.reporting_clients else None,
            reporting_clients=s.reporting_clients,
            rate=s.client_elements_per_second if s.reporting_clients else None,
        )

    @property
    def busy(self) -> float | None:
        """The workers' total CPU used, in units of one worker's CPU given: a throughput proxy."""
        return None if self.cpu_mean is None else self.cpu_mean * self.workers_answering


@dataclass(frozen=True)
class Policy:
    """``spec.autoscaling`` as the decision needs it (fractions, not percentages)."""

    min_replicas: int
    max_replicas: int
    scale_down_always: bool
    window_seconds: float
    saturated_cpu: float
    stalled: float

    @classmethod
    def of(cls, a: AutoscalingSpec) -> Policy:
        return cls(
            min_replicas=a.min_replicas,
            max_replicas=a.max_replicas,
            scale_down_always=a.scale_down == SCALE_DOWN_ALWAYS,
            window_seconds=float(a.scale_down_stabilization_window_seconds),
            saturated_cpu=a.target_cpu_utilization_percentage / 100,
            stalled=a.target_data_stall_percentage / 100,
        )


@dataclass(frozen=True)
class LastScale:
    at: float
    from_replicas: int
    to_replicas: int
    # False for a clamp to min/max and for a count set outside the autoscaler: only a scale-up
    # the load asked for is judged by whether it helped.
    load_driven: bool = True
    # A scale-up asked for by stalled trainers while the workers were below the CPU target: undone
    # if the trainers do not read faster.
    trial: bool = False


@dataclass(frozen=True)
class Plateau:
    """A count at which adding workers stopped helping, and the load it was found at."""

    replicas: int
    at: float
    stall: float | None
    busy: float | None
    # Found by a trial: the workers' CPU says nothing of that load, more reporting trainers do.
    clients: int | None = None
    # Found while the step's workers are kept (scaleDown WhenIdle): the count before the step and the
    # trainers' rate then, so that later readings can still show the step helped (see ``add``).
    before: tuple[int, float] | None = None


@dataclass(frozen=True)
class History:
    """What the decision remembers between calls (the caller passes back ``ScaleDecision.history``)."""

    last: LastScale | None = None
    plateau: Plateau | None = None
    # The count a trial reached: removing workers while clients read stops there.
    floor: int | None = None


@dataclass(frozen=True)
class ScaleDecision:
    current: int
    replicas: int
    reason: str
    next_check_seconds: float
    history: History

    @property
    def scales(self) -> bool:
        return self.replicas != self.current


class Verdict(Enum):
    ADD = "add"
    SPARE = "spare"
    HOLD = "hold"


def assess(s: Sample, p: Policy) -> tuple[Verdict, str]:
    """What one reading says, and why, in words for the status and the Events."""
    if s.cpu_mean is None:
        return Verdict.HOLD, "no worker reported its CPU yet"
    cpu = f"workers at {_pct(s.cpu_mean)} CPU"
    saturated = s.cpu_mean >= p.saturated_cpu
    idle = s.cpu_mean < p.saturated_cpu / 2
    if s.stall_mean is None:
        # Plain distribute() trainers report nothing: the workers' saturation alone decides.
        if saturated:
            return Verdict.ADD, f"{cpu} (no trainer reports its data stalls)"
        if idle:
            return Verdict.SPARE, f"{cpu} (no trainer reports its data stalls)"
        return Verdict.HOLD, f"{cpu}, below the {_pct(p.saturated_cpu)} target"
    stall = f"trainers waited on data {_pct(s.stall_mean)} of the time"
    if s.stall_mean >= p.stalled:
        if saturated:
            return Verdict.ADD, f"{stall}, {cpu}"
        # The workers wait too (on storage, the network): only a step can tell whether more help.
        return Verdict.ADD, f"{stall}, {cpu}: waiting on input, not CPU"
    if s.stall_mean < p.stalled / 2 and idle:
        return Verdict.SPARE, f"{stall}, {cpu}"
    return Verdict.HOLD, f"{stall}, {cpu}: the trainers are fed"


def retention_seconds(p: Policy) -> float:
    """How far back a decision may look: the scale-down window, or a scale-up's before-and-after."""
    after_scale_up = WARMUP_TIMEOUT_SECONDS + SETTLE_SECONDS + 2 * UP_WINDOW_SECONDS
    return max(p.window_seconds, UP_WINDOW_SECONDS, after_scale_up) + CHECK_SECONDS


def decide(p: Policy, current: int, samples: Sequence[Sample], history: History, now: float) -> ScaleDecision:
    """The count the workers should have now. ``samples`` are oldest first."""
    if history.last is None:
        # The first decision (a new service, or one that just started to autoscale): the count
        # may have just changed, so its readings count once they have settled, like after a
        # scale, and a later change made outside the autoscaler is told from its own.
        history = replace(history, last=LastScale(now, current, current, load_driven=False))
    return _Deciding(p, current, samples, history, now).decide()


class _Keep(Enum):
    """``_Deciding.scale``'s default floor: the one the history has."""

    KEEP = "keep"


_KEEP = _Keep.KEEP


@dataclass(frozen=True)
class _Deciding:
    p: Policy
    current: int
    samples: Sequence[Sample]
    history: History
    now: float

    def hold(self, reason: str, check: float = CHECK_SECONDS, history: History | None = None) -> ScaleDecision:
        return ScaleDecision(self.current, self.current, reason, check, self.history if history is None else history)

    def scale(
        self,
        to: int,
        reason: str,
        load_driven: bool = True,
        *,
        trial: bool = False,
        plateau: Plateau | None = None,
        floor: int | _Keep | None = _KEEP,
    ) -> ScaleDecision:
        """A new count; the floor stays what it was unless given (None forgets it)."""
        kept = self.history.floor if isinstance(floor, _Keep) else floor
        last = LastScale(self.now, self.current, to, load_driven, trial)
        history = History(last, plateau, None if kept is None else min(kept, self.p.max_replicas))
        return ScaleDecision(self.current, to, reason, CHECK_SECONDS, history)

    def decide(self) -> ScaleDecision:
        p, current, samples, now = self.p, self.current, self.samples, self.now
        clamped = min(max(current, p.min_replicas), p.max_replicas)
        if clamped != current:
            why = f"{current} workers is outside minReplicas {p.min_replicas} to maxReplicas {p.max_replicas}"
            return self.scale(clamped, why, load_driven=False)
        last = self.history.last
        assert last is not None  # decide() gives the first decision one
        if current != last.to_replicas:
            if current == last.from_replicas and now - last.at < SETTLE_SECONDS:
                return self.hold(f"waiting for the scale from {current} to {last.to_replicas} workers to be observed")
            # kubectl scale, or a kubectl apply that sets spec.workers.replicas: the new starting point.
            outside = History(LastScale(now, last.to_replicas, current, load_driven=False))
            why = (
                f"{current} workers were set outside the autoscaler (kubectl scale?); "
                "deciding from the signals read after it"
            )
            return self.hold(why, history=outside)
        if not samples or now - samples[-1].at > MAX_SAMPLE_AGE_SECONDS:
            ago = f"last read {now - samples[-1].at:.0f}s ago" if samples else "none read yet"
            return self.hold(f"no recent signals from the dispatcher ({ago})")
        latest = samples[-1]
        if not latest.reading:
            return self.idle(latest)
        if current == 0:
            # Scaled to zero and a client attached: it waits for a worker, so no evidence is needed.
            return self.scale(1, "a client is reading and no worker runs (scaled to zero)", load_driven=False)

        since = _settled_since(last, current, samples, now)
        if since is None:
            return self.hold(
                f"waiting for the new workers to answer the dispatcher ({latest.workers_answering} of {current}) "
                f"after the scale from {last.from_replicas} to {current}"
            )
        fresh = [s for s in samples if s.at >= since]
        if not fresh:
            return self.hold(f"gathering signals for {current} worker{'' if current == 1 else 's'}")
        recent = [s for s in fresh if s.at >= now - UP_WINDOW_SECONDS]
        if _covers(recent, now, UP_WINDOW_SECONDS / 2) and all(assess(s, p)[0] is Verdict.ADD for s in recent):
            return self.add(recent)
        verdict, why = assess(latest, p)
        if verdict is Verdict.SPARE and current > p.min_replicas:
            return self.remove_while_reading(fresh, why)
        return self.hold(why)

    def idle(self, latest: Sample) -> ScaleDecision:
        """No client reads: the count does not matter now, so the workers go once the quiet lasts."""
        p = self.p
        quiet = History(self.history.last)  # the next reader may bring another load: forget the plateau
        if self.current == 0:
            # The first client to attach waits for a worker: look often (a read of the dispatcher pod).
            return self.hold("no client reads; scaled to zero", CHECK_SECONDS, quiet)
        if self.current <= p.min_replicas:
            return self.hold("no client reads", QUIET_CHECK_SECONDS, quiet)
        if latest.idle_seconds >= p.window_seconds:
            return self.scale(p.min_replicas, f"no client has read for {latest.idle_seconds:.0f}s", floor=None)
        left = p.window_seconds - latest.idle_seconds
        why = f"no client has read for {latest.idle_seconds:.0f}s; removing workers after {p.window_seconds:.0f}s"
        return self.hold(why, max(1.0, min(QUIET_CHECK_SECONDS, left)), quiet)

    def add(self, recent: list[Sample]) -> ScaleDecision:
        p, current, history = self.p, self.current, self.history
        stall, busy = _mean([s.stall_mean for s in recent]), _mean([s.busy for s in recent])
        cpu = _mean([s.cpu_mean for s in recent]) or 0.0
        # The reason gives the evidence's averages, not one reading's.
        why = assess(replace(recent[-1], cpu_mean=cpu, stall_mean=stall), p)[1]
        if current >= p.max_replicas:
            return self.hold(f"{why}; already at maxReplicas {p.max_replicas}")
        plateau = history.plateau
        if (
            plateau is not None
            and current >= plateau.replicas
            and not _load_grew(plateau, recent[-1], stall, busy, self.now)
        ):
            helped = _helped_after_all(plateau, current, _mean([s.rate for s in recent]))
            if helped is None:
                return self.hold(f"{why}; adding workers stopped helping at {plateau.replicas}")
            why = f"{why}; {helped}"
        last = history.last
        # Judge the last scale-up only once: after the load grew past a plateau, the readings before
        # and after it no longer compare like with like.
        if plateau is None and last is not None and last.load_driven and last.to_replicas > last.from_replicas:
            before = [s for s in self.samples if last.at - UP_WINDOW_SECONDS <= s.at < last.at]
            if found := _not_helped(last, before, recent):
                return self.not_helped(recent, f"from {last.from_replicas} to {last.to_replicas} {found}", why)
        wanted = math.ceil(current * cpu / p.saturated_cpu - 1e-9)
        if stall is not None:
            wanted = max(wanted, math.ceil(current / (1 - min(stall, _MAX_STALL_FOR_STEP)) - 1e-9))
        to = min(max(wanted, current + 1), 2 * current, p.max_replicas)
        if cpu < p.saturated_cpu:
            why = f"{why}; trying {to} (kept if the trainers read faster)"
            return self.scale(to, why, trial=True, floor=max(to, history.floor or 0))
        return self.scale(to, why)

    def not_helped(self, recent: list[Sample], tried: str, why: str) -> ScaleDecision:
        """The last scale-up did not make the trainers faster: stop adding at this load."""
        history, last, p = self.history, self.history.last, self.p
        assert last is not None
        stall, busy = _mean([s.stall_mean for s in recent]), _mean([s.busy for s in recent])
        clients = recent[-1].reporting_clients if last.trial else None
        if last.trial and p.scale_down_always:
            # Undone: the workers it added only cost. The plateau is the count before it.
            back = Plateau(last.from_replicas, self.now, stall, busy, clients)
            floor = None if history.floor is None else min(history.floor, last.from_replicas)
            why = f"{why}; more workers did not help: {tried}; back to {last.from_replicas}"
            return self.scale(last.from_replicas, why, load_driven=False, plateau=back, floor=floor)
        why = f"{why}; adding workers stopped helping: {tried}"
        if last.trial:
            why += " (scaleDown WhenIdle keeps them until no client reads)"
        rate_before = _mean([s.rate for s in self.samples if last.at - UP_WINDOW_SECONDS <= s.at < last.at])
        before = None if rate_before is None else (last.from_replicas, rate_before)
        plateau = Plateau(self.current, self.now, stall, busy, clients, before)
        return self.hold(why, history=replace(history, plateau=plateau))

    def remove_while_reading(self, fresh: list[Sample], why: str) -> ScaleDecision:
        p, current, now = self.p, self.current, self.now
        if not p.scale_down_always:
            return self.hold(f"{why}; scaleDown WhenIdle removes workers only once no client reads")
        span = max(p.window_seconds, UP_WINDOW_SECONDS)
        window = [s for s in fresh if s.at >= now - span]
        # The readings must cover the whole window (give or take one check), all saying SPARE.
        floor = self.history.floor
        if floor is not None and current <= floor:
            return self.hold(
                f"{why}; keeping the {floor} workers that made the trainers read faster until no client reads "
                "(their CPU cannot say how many the input needs)"
            )
        if _covers(window, now, span - CHECK_SECONDS) and all(assess(s, p)[0] is Verdict.SPARE for s in window):
            busiest = max((s.busy or 0.0) for s in window)
            needed = math.ceil(busiest / (p.saturated_cpu * DOWN_TO_UTILIZATION))
            to = max(needed, math.ceil(current / 2), p.min_replicas, floor or 0)
            if to < current:
                return self.scale(to, f"{why} for {span:.0f}s while clients read (scaleDown Always)")
        return self.hold(f"{why}; removing workers once that holds for {span:.0f}s")


def _not_helped(last: LastScale, before: list[Sample], after: list[Sample]) -> str | None:
    """None when the last scale-up helped (or cannot be judged); else what the readings show."""
    rate_before, rate = _mean([s.rate for s in before]), _mean([s.rate for s in after])
    if rate is not None and rate_before:
        if rate / rate_before - 1 >= MIN_SPEEDUP:
            return None
        return f"workers, the trainers read {rate_before:.1f} then {rate:.1f} elements/s"
    stall_before, stall = _mean([s.stall_mean for s in before]), _mean([s.stall_mean for s in after])
    if stall is not None and stall_before is not None:
        # A trainer that waited all the time before the step: 1 - stall compares nothing.
        if stall_before < 1.0 and (1 - stall) / (1 - stall_before) - 1 >= MIN_SPEEDUP:
            return None
        return f"workers, the trainers' wait went from {_pct(stall_before)} to {_pct(stall)} of the time"
    busy, busy_before = _mean([s.busy for s in after]), _mean([s.busy for s in before])
    if busy is None or not busy_before:
        return None
    could = last.to_replicas / last.from_replicas - 1
    if busy / busy_before - 1 >= MIN_SCALING_EFFICIENCY * could:
        return None
    return f"workers, their busy CPU went from {busy_before:.2f} to only {busy:.2f} workers' worth"


def _helped_after_all(plateau: Plateau, current: int, rate: float | None) -> str | None:
    """Why a step judged not to help did help after all, or None.

    A step is judged over the readings just after its workers settle; on a loaded node a new worker
    can take longer than that to start serving the trainers' jobs, and the step then looks useless.
    Where its workers stayed (scaleDown WhenIdle), the readings at that count keep being compared with
    the rate before the step: a rise of half of what the added workers could give (far above noise)
    ends the plateau, and adding goes on.
    """
    if plateau.before is None or rate is None or current != plateau.replicas:
        return None
    frm, rate_before = plateau.before
    if rate_before <= 0 or rate / rate_before - 1 < MIN_SCALING_EFFICIENCY * (current / frm - 1):
        return None
    return f"the step from {frm} to {current} workers helped after all ({rate_before:.1f} then {rate:.1f} elements/s)"


def _load_grew(plateau: Plateau, latest: Sample, stall: float | None, busy: float | None, now: float) -> bool:
    if now - plateau.at >= PLATEAU_SECONDS:
        return True
    if stall is not None and plateau.stall is not None and stall >= plateau.stall + PLATEAU_STALL_RISE:
        return True
    if plateau.clients is not None:
        return latest.reporting_clients > plateau.clients
    return busy is not None and plateau.busy is not None and busy >= plateau.busy * PLATEAU_BUSY_RISE


def _settled_since(last: LastScale, current: int, samples: Sequence[Sample], now: float) -> float | None:
    """From when readings describe the current count; None while new workers are still coming up."""
    if last.to_replicas > last.from_replicas:
        answered = next((s.at for s in samples if s.at >= last.at and s.workers_answering >= current), None)
        if answered is not None:
            return answered + SETTLE_SECONDS
        if now - last.at < WARMUP_TIMEOUT_SECONDS:
            return None
    return last.at + SETTLE_SECONDS


def _covers(samples: list[Sample], now: float, span: float) -> bool:
    """At least two readings, the oldest at least ``span`` old: one reading is never evidence."""
    return len(samples) >= 2 and now - samples[0].at >= span


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"
