"""Trials of a sweep that share one preprocessing: trial ``k`` of a shared job, read through the cache.

A sweep runs many trials of one model (other hyperparameters) on the same preprocessed stream.
Read as one shared job with TensorFlow's *cross-trainer cache*, the workers compute each element
once and keep it in a sliding window (``spec.workers.crossTrainerCacheSize`` per worker and job),
and every trial reads every element from there. Each trial needs a trainer id of its own: readers
with the same id share one position in the stream, so they split its elements between them
(``CrossTrainerCache(trainer_id=...)``).

TensorFlow refuses the cache without a named job, on a dataset that is not infinite, with
coordinated reads (``num_consumers``), and when a job is iterated more than once in one process;
a dataset whose length it cannot tell is let through and fails every trial once it ends
(``tensorflow/core/data/service/client/validate_utils.cc``, ``task_runner.cc``). Everything here
is pure: the decision, and an error that says what to change.
"""

from __future__ import annotations

from tfdata_operator.client.lockstep import INFINITE, UNKNOWN, Place

MAX_TRIAL_LENGTH = 200


class SweepError(ValueError):
    """A trial of a sweep that TensorFlow's cross-trainer cache would refuse, or that would read wrongly."""


def trainer_id(trial: object) -> str:
    """The cross-trainer cache's trainer id for ``trial``: ``trial-<k>``, the same in every run of trial k."""
    if isinstance(trial, bool) or not isinstance(trial, (int, str)):
        raise SweepError(f"trial must be the trial's number (0, 1, ...) or its name, got {trial!r}")
    if isinstance(trial, int) and trial < 0:
        raise SweepError(f"trial must be 0 or more, got {trial}")
    if isinstance(trial, str) and not 0 < len(trial) <= MAX_TRIAL_LENGTH:
        raise SweepError(f"trial must be a name of 1 to {MAX_TRIAL_LENGTH} characters, got {trial!r:.240}")
    return f"trial-{trial}"


def plan(
    trial: object,
    *,
    job_name: str | None,
    cardinality: int,
    where: Place | None,
    lockstep: bool | None,
    cross_trainer_cache: bool = False,
) -> str | None:
    """The trainer id to read with as ``trial`` (None: no trial, nothing to do).

    ``where`` is the trainer's place among synchronous trainers (``lockstep.place``), ``lockstep``
    the caller's choice, ``cardinality`` the dataset's (-1 infinite, -2 unknown) and
    ``cross_trainer_cache`` whether TensorFlow's argument was also given.
    """
    if trial is None:
        return None
    own = trainer_id(trial)
    who = f"trial {trial!r}"
    if cross_trainer_cache:
        raise SweepError(
            f"{who}: pass trial= or cross_trainer_cache=, not both: trial={trial!r} reads with "
            f"cross_trainer_cache=CrossTrainerCache(trainer_id={own!r})"
        )
    if not job_name:
        raise SweepError(
            f"{who} reads a sweep's shared job through the cross-trainer cache, which TensorFlow allows only on a "
            "named job: pass the same job_name= in every trial of the sweep (for example the sweep's name). "
            "Without one each trial gets a job of its own, and the workers compute every element once per trial"
        )
    if where is not None and where.count > 1 and lockstep is not False:
        raise SweepError(
            f"{who}: this trainer is one of {where.count} trainers in lockstep (trainer {where.index}, from "
            f"{where.source}), but TensorFlow refuses coordinated reads together with the cross-trainer cache. Run "
            "each trial as one trainer, or pass lockstep=False: the trial's trainers then share its stream "
            "first-come-first-served (the stream is infinite, so every trainer still gets full batches)"
        )
    repeat = (
        "Add .repeat() at the end of the pipeline (before distribute) and count epochs in steps "
        "(steps_per_epoch = elements per pass // batch size)"
    )
    if cardinality == UNKNOWN:
        raise SweepError(
            f"{who} reads through the cross-trainer cache, which needs an infinite dataset, and TensorFlow cannot "
            "tell whether this one ends (a filter, a generator or another transformation of unknown length is "
            "last): if it ends, every trial fails with 'Cross-trainer caching requires the input dataset to be "
            f"infinite'. {repeat}"
        )
    if cardinality != INFINITE:
        raise SweepError(
            f"{who} reads through the cross-trainer cache, which TensorFlow refuses on a dataset that ends (this "
            f"one after {cardinality} element(s)): the trials read a sliding window of one endless stream. {repeat}"
        )
    return own
