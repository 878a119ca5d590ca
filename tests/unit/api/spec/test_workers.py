"""spec.workers (api/spec/workers.py): the cross-trainer cache's bound, an explicit null, the memory it asks for."""

from __future__ import annotations

import pytest

from tfdata_operator.api import spec

from fixtures.cases import parse


def test_a_cross_trainer_cache_of_exactly_its_upper_bound_is_accepted() -> None:
    svc = parse(
        workers={"crossTrainerCacheSize": spec.MAX_CROSS_TRAINER_CACHE, "resources": {"limits": {"memory": "2Ti"}}}
    )
    assert svc.workers.cross_trainer_cache_size_bytes == spec.quantity_bytes(spec.MAX_CROSS_TRAINER_CACHE) == 2**40


def test_an_explicit_null_cross_trainer_cache_is_unset_not_an_unknown_field() -> None:
    assert parse(workers={"crossTrainerCacheSize": None}).workers.cross_trainer_cache_size_bytes is None


def test_the_memory_a_cache_refusal_asks_for_is_rounded_up_to_a_whole_mi_that_fits() -> None:
    # 1Gi and one byte, plus the 512Mi margin: 1536Mi would be a byte short.
    with pytest.raises(spec.SpecError) as err:
        parse(workers={"crossTrainerCacheSize": 2**30 + 1})
    assert err.value.problems == [
        f"spec.workers.crossTrainerCacheSize ({2**30 + 1}) needs a memory limit for the workers, to check that the "
        f"cache fits: each worker keeps up to {2**30 + 1} in memory for each job read through the cross-trainer "
        "cache, beside the 512Mi a TensorFlow worker holds itself. Set spec.workers.resources.limits.memory to at "
        "least 1537Mi (or requests.memory)"
    ]
    fits = parse(workers={"crossTrainerCacheSize": 2**30 + 1, "resources": {"limits": {"memory": "1537Mi"}}})
    assert fits.workers.cross_trainer_cache_size_bytes == 2**30 + 1


def test_a_cache_that_does_not_fit_is_told_the_limit_as_written_and_a_most_that_fits() -> None:
    """2G is 1907.3Mi: the refusal quotes the limit as the user wrote it, and the most it offers (rounded
    down to a whole Mi) is accepted, where one Mi more is not."""
    resources = {"limits": {"memory": "2G"}}
    with pytest.raises(spec.SpecError) as err:
        parse(workers={"crossTrainerCacheSize": "2G", "resources": resources})
    assert err.value.problems == [
        "spec.workers.crossTrainerCacheSize (2G) does not fit in the workers' memory: "
        "spec.workers.resources.limits.memory is 2G, and a worker needs the cache plus about 512Mi for TensorFlow "
        "itself. Set crossTrainerCacheSize to at most 1395Mi, or spec.workers.resources.limits.memory to at least "
        "2420Mi"
    ]
    fits = parse(workers={"crossTrainerCacheSize": "1395Mi", "resources": resources})
    assert fits.workers.cross_trainer_cache_size_bytes == 1395 * 2**20
    with pytest.raises(spec.SpecError, match=r"Set crossTrainerCacheSize to at most 1395Mi"):
        parse(workers={"crossTrainerCacheSize": "1396Mi", "resources": resources})
