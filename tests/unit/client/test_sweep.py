"""Trials of a sweep on one shared job through the cross-trainer cache: the trainer id and the refusals (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from tfdata_operator.client import sweep
from tfdata_operator.client.lockstep import INFINITE, UNKNOWN, Place
from tfdata_operator.client.sweep import SweepError


def plan(trial: Any = 3, **given: Any) -> str | None:
    fields: dict[str, Any] = {"job_name": "sweep-7", "cardinality": INFINITE, "where": None, "lockstep": None}
    return sweep.plan(trial, **{**fields, **given})


def refusal(trial: Any = 3, **given: Any) -> str:
    with pytest.raises(SweepError) as err:
        plan(trial, **given)
    return str(err.value)


def test_no_trial_reads_as_before() -> None:
    assert plan(None) is None
    assert plan(None, job_name=None, cardinality=10, where=Place(0, 2, "TF_CONFIG")) is None


@pytest.mark.parametrize(("trial", "trainer_id"), [(0, "trial-0"), (3, "trial-3"), ("lr-0.01", "trial-lr-0.01")])
def test_each_trial_reads_with_a_trainer_id_of_its_own(trial: Any, trainer_id: str) -> None:
    assert plan(trial) == trainer_id


def test_trials_of_one_trainer_each_or_of_trainers_sharing_first_come_first_served_are_taken() -> None:
    assert plan(where=Place(0, 1, "TF_CONFIG")) == "trial-3"  # one trainer: nothing in lockstep
    # lockstep=False: the trial's trainers share its stream (the same trainer id) first-come-first-served.
    assert plan(where=Place(1, 2, "TF_CONFIG"), lockstep=False) == "trial-3"


def test_two_ways_to_the_cache_are_refused() -> None:
    assert refusal(cross_trainer_cache=True) == (
        "trial 3: pass trial= or cross_trainer_cache=, not both: trial=3 reads with "
        "cross_trainer_cache=CrossTrainerCache(trainer_id='trial-3')"
    )


@pytest.mark.parametrize("job_name", [None, ""])
def test_a_trial_without_a_shared_job_is_refused(job_name: str | None) -> None:
    assert refusal(job_name=job_name) == (
        "trial 3 reads a sweep's shared job through the cross-trainer cache, which TensorFlow allows only on a "
        "named job: pass the same job_name= in every trial of the sweep (for example the sweep's name). Without one "
        "each trial gets a job of its own, and the workers compute every element once per trial"
    )


@pytest.mark.parametrize("where", [Place(1, 2, "TF_CONFIG"), Place(0, 4, "arguments")])
@pytest.mark.parametrize("lockstep", [None, True])
def test_a_trial_of_trainers_in_lockstep_is_refused(where: Place, lockstep: bool | None) -> None:
    said = refusal(where=where, lockstep=lockstep)
    assert said.startswith(
        f"trial 3: this trainer is one of {where.count} trainers in lockstep (trainer {where.index}, from "
        f"{where.source}), but TensorFlow refuses coordinated reads together with the cross-trainer cache"
    )
    assert said.endswith("or pass lockstep=False: the trial's trainers then share its stream first-come-first-served "
                         "(the stream is infinite, so every trainer still gets full batches)")  # fmt: skip


@pytest.mark.parametrize("cardinality", [0, 1, 1000])
def test_a_dataset_that_ends_is_refused_saying_to_repeat(cardinality: int) -> None:
    said = refusal(cardinality=cardinality)
    assert f"refuses on a dataset that ends (this one after {cardinality} element(s))" in said
    assert said.endswith("Add .repeat() at the end of the pipeline (before distribute) and count epochs in steps "
                         "(steps_per_epoch = elements per pass // batch size)")  # fmt: skip


def test_a_dataset_of_unknown_length_is_refused_though_tensorflow_lets_it_through() -> None:
    said = refusal(cardinality=UNKNOWN)
    assert "TensorFlow cannot tell whether this one ends" in said
    assert "every trial fails with 'Cross-trainer caching requires the input dataset to be infinite'" in said
    assert "Add .repeat() at the end of the pipeline" in said


@pytest.mark.parametrize(
    ("trial", "said"),
    [
        (-1, "trial must be 0 or more, got -1"),
        (True, "trial must be the trial's number (0, 1, ...) or its name, got True"),
        (1.5, "trial must be the trial's number (0, 1, ...) or its name, got 1.5"),
        ("", "trial must be a name of 1 to 200 characters, got ''"),
        ("x" * 201, "trial must be a name of 1 to 200 characters"),
    ],
)
def test_a_trial_that_is_no_number_or_name_is_refused(trial: Any, said: str) -> None:
    assert refusal(trial).startswith(said)


def test_the_trial_is_checked_first_then_the_job_then_the_place_then_the_length() -> None:
    assert refusal(-1, job_name=None).startswith("trial must be 0 or more")
    assert "named job" in refusal(job_name=None, cardinality=5, where=Place(0, 2, "TF_CONFIG"))
    assert "in lockstep" in refusal(cardinality=5, where=Place(0, 2, "TF_CONFIG"))
