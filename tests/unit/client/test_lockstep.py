"""Many trainers in lockstep: the trainer's place from TF_CONFIG or arguments, and how it must read (pure)."""

from __future__ import annotations

import json

import pytest

from tfdata_operator.client import lockstep
from tfdata_operator.client.lockstep import INFINITE, UNKNOWN, LockstepError, Place, Read


def tf_config(kind: str, index: int, workers: int = 2, chief: bool = False, **more: list[str]) -> str:
    cluster = {"worker": [f"w{i}:2222" for i in range(workers)], **more}
    if chief:
        cluster["chief"] = ["c:2222"]
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (tf_config("worker", 0), Place(0, 2, "TF_CONFIG")),
        (tf_config("worker", 1), Place(1, 2, "TF_CONFIG")),
        (tf_config("chief", 0, workers=2, chief=True), Place(0, 3, "TF_CONFIG")),  # the chief trains too
        (tf_config("worker", 1, workers=2, chief=True), Place(2, 3, "TF_CONFIG")),  # workers after the chief
        (tf_config("worker", 0, workers=1), Place(0, 1, "TF_CONFIG")),
        (tf_config("evaluator", 0, evaluator=["e:2222"]), None),  # trains nothing
        (tf_config("worker", 0, ps=["p:2222"]), None),  # ParameterServerStrategy: asynchronous
        (None, None),
        ("", None),
        ({"cluster": {"worker": ["a", "b"]}, "task": {"type": "worker", "index": 1}}, Place(1, 2, "TF_CONFIG")),
    ],
)
def test_the_trainers_place_comes_from_tf_config(config: str | None, expected: Place | None) -> None:
    assert lockstep.place_from_tf_config(config) == expected


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ("{not json", "TF_CONFIG is not JSON"),
        ("[1, 2]", "must be a JSON object"),
        (tf_config("worker", 2), "lists 2 worker(s)"),
        (tf_config("worker", "x"), "must be an integer"),  # type: ignore[arg-type]
        (json.dumps({"cluster": {"worker": ["a"]}, "task": {"type": "chief", "index": 0}}), "no 'chief' entry"),
        (json.dumps({"cluster": {"chief": ["a", "b"]}, "task": {"type": "chief", "index": 0}}), "at most one"),
    ],
)
def test_a_tf_config_that_places_no_trainer_is_refused_with_what_is_wrong(config: str, says: str) -> None:
    with pytest.raises(LockstepError) as raised:
        lockstep.place_from_tf_config(config)
    assert says in str(raised.value)


def test_explicit_arguments_win_over_tf_config_and_come_together() -> None:
    assert lockstep.place(1, 4, tf_config("worker", 0)) == Place(1, 4, "arguments")
    assert lockstep.place(None, None, tf_config("worker", 1)) == Place(1, 2, "TF_CONFIG")
    with pytest.raises(LockstepError, match="together"):
        lockstep.place(1, None, None)
    with pytest.raises(LockstepError, match=r"in 0\.\.count-1"):
        lockstep.place(4, 4, None)


TWO = Place(1, 2, "TF_CONFIG")


def test_many_trainers_read_in_rounds_on_an_infinite_dataset() -> None:
    read = lockstep.plan(TWO, lockstep=None, job_name="run-1", cardinality=INFINITE)
    assert read == Read(1, 2)
    assert read.kwargs() == {"consumer_index": 1, "num_consumers": 2}


def test_one_trainer_or_no_place_reads_as_before() -> None:
    """The single-trainer behaviour does not change: no coordinated reads, finite datasets allowed."""
    assert lockstep.plan(None, lockstep=None, job_name=None, cardinality=100).kwargs() == {}
    assert lockstep.plan(Place(0, 1, "TF_CONFIG"), lockstep=None, job_name=None, cardinality=100) == Read()
    assert lockstep.plan(Place(0, 1, "arguments"), lockstep=True, job_name="j", cardinality=100) == Read()


def test_lockstep_false_reads_first_come_first_served_and_conflicts_with_explicit_coordinates() -> None:
    assert lockstep.plan(TWO, lockstep=False, job_name="j", cardinality=100) == Read()
    with pytest.raises(LockstepError, match="leave them out, or drop lockstep=False"):
        lockstep.plan(Place(0, 2, "arguments"), lockstep=False, job_name="j", cardinality=INFINITE)


@pytest.mark.parametrize(
    ("where", "kwargs", "advice"),
    [
        (None, {"lockstep": True}, "set TF_CONFIG"),
        (TWO, {"job_name": None}, "pass the same job_name= in every trainer"),
        (TWO, {"cardinality": 1001}, "ends after 1001 element(s)"),
        (TWO, {"cardinality": 1001}, "Add .repeat() at the end of the pipeline"),
        (TWO, {"cardinality": 1001}, "steps_per_epoch"),
        (TWO, {"cardinality": 0}, "ends after 0 element(s)"),
        # TensorFlow lets it through; when it ends one trainer fails and the others wait forever.
        (TWO, {"cardinality": UNKNOWN}, "cannot tell whether this one ends"),
        (TWO, {"cardinality": UNKNOWN}, "Add .repeat() at the end of the pipeline"),
        (TWO, {"target_workers": "local"}, "use target_workers='AUTO'"),
        (TWO, {"cross_trainer_cache": True}, "drop cross_trainer_cache="),
    ],
)
def test_a_setup_that_would_fail_or_give_unequal_work_is_refused_with_what_to_use(
    where: Place | None, kwargs: dict[str, object], advice: str
) -> None:
    args: dict[str, object] = {"lockstep": None, "job_name": "run-1", "cardinality": INFINITE, **kwargs}
    with pytest.raises(LockstepError) as raised:
        lockstep.plan(where, **args)  # type: ignore[arg-type]
    assert advice in str(raised.value)
    if where is not None:
        assert "trainer 1, from TF_CONFIG" in str(raised.value)


def test_lockstep_errors_are_value_errors_exported_by_the_helper() -> None:
    from tfdata_operator import client

    assert issubclass(client.LockstepError, ValueError)
