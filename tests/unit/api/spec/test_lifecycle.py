"""spec/lifecycle.py: spec.lifecycle (the workload a service follows, and when it suspends or deletes
itself) and spec.nodeLoss, read edge by edge, with the whole sentence of each refusal."""

from __future__ import annotations

from typing import Any

import pytest

from tfdata_operator.api import spec

from fixtures.cases import parse

JOB = {"apiVersion": "batch/v1", "kind": "Job", "name": "train"}
# The longest values each field of spec.lifecycle.workload takes: 253, 63 and 253 characters.
API_VERSION_253 = "a" * 250 + "/v1"
KIND_63 = "J" + "a" * 62
NAME_253 = ".".join(["a" * 61, "b" * 63, "c" * 63, "d" * 63])
KIND_SAYS = "it must be a kind as Kubernetes spells it, a capital letter first (Job, JobSet)"
NAME_SAYS = "it must be a Kubernetes object name (lowercase letters, digits, '-' and '.')"
API_VERSION_SAYS = "it must be an apiVersion such as batch/v1 or jobset.x-k8s.io/v1alpha2"


def refusal(**fields: Any) -> list[str]:
    with pytest.raises(spec.SpecError) as err:
        parse(**fields)
    return err.value.problems


def test_the_longest_workload_reference_is_kept_as_written() -> None:
    workload = {"apiVersion": API_VERSION_253, "kind": KIND_63, "name": NAME_253}
    assert parse(lifecycle={"workload": workload}).lifecycle.workload == spec.WorkloadRef(
        API_VERSION_253, KIND_63, NAME_253
    )


def test_the_least_waits_are_taken_at_once_after_the_workload_and_one_second_idle() -> None:
    """afterSeconds 0 acts as soon as the workload finishes; an idle service waits at least a second."""
    lifecycle = parse(
        lifecycle={"workload": JOB, "afterWorkloadFinishes": {"afterSeconds": 0}, "idle": {"suspendAfterSeconds": 1}}
    ).lifecycle
    assert lifecycle.after_workload_finishes == spec.AfterWorkloadFinishes(action="Suspend", after_seconds=0)
    assert lifecycle.idle == spec.IdleSpec(suspend_after_seconds=1)


def test_a_fenced_by_of_256_characters_is_kept() -> None:
    assert parse(nodeLoss={"fencedBy": "f" * 256}).node_loss.fenced_by == "f" * 256


# (id, spec fields, the whole refusal)
REFUSED: list[tuple[str, dict[str, Any], list[str]]] = [
    ("workload-fields-one-too-long",
     {"lifecycle": {"workload": {"apiVersion": "a" + API_VERSION_253, "kind": KIND_63 + "a", "name": "a" + NAME_253}}},
     ["spec.lifecycle.workload.apiVersion must be 1 to 253 characters long, got 254",
      "spec.lifecycle.workload.kind must be 1 to 63 characters long, got 64",
      "spec.lifecycle.workload.name must be 1 to 253 characters long, got 254"]),
    ("workload-fields-misspelled",
     {"lifecycle": {"workload": {"apiVersion": "Batch/v1", "kind": "job", "name": "Train"}}},
     [f"spec.lifecycle.workload.apiVersion has an invalid value 'Batch/v1': {API_VERSION_SAYS}",
      f"spec.lifecycle.workload.kind has an invalid value 'job': {KIND_SAYS}",
      f"spec.lifecycle.workload.name has an invalid value 'Train': {NAME_SAYS}"]),
    ("workload-empty", {"lifecycle": {"workload": {}}},
     ["spec.lifecycle.workload.apiVersion is required",
      "spec.lifecycle.workload.kind is required",
      "spec.lifecycle.workload.name is required"]),
    # A field that is there but wrong is named for what is wrong with it, not as missing.
    ("workload-name-only-wrong", {"lifecycle": {"workload": {**JOB, "name": ""}}},
     ["spec.lifecycle.workload.name must be 1 to 253 characters long, got 0"]),
    ("following-no-workload", {"lifecycle": {"afterWorkloadFinishes": {}, "deleteWithWorkload": True}},
     ["spec.lifecycle.afterWorkloadFinishes needs spec.lifecycle.workload: "
      "name the Job (or other workload) it follows",
      "spec.lifecycle.deleteWithWorkload needs spec.lifecycle.workload: name the Job (or other workload) it follows"]),
    ("after-seconds-below-0", {"lifecycle": {"workload": JOB, "afterWorkloadFinishes": {"afterSeconds": -1}}},
     ["spec.lifecycle.afterWorkloadFinishes.afterSeconds must be between 0 and 604800, got -1"]),
    ("idle-0-seconds", {"lifecycle": {"idle": {"suspendAfterSeconds": 0}}},
     ["spec.lifecycle.idle.suspendAfterSeconds must be between 1 and 604800, got 0"]),
    ("idle-without-seconds", {"lifecycle": {"idle": {}}},
     ["spec.lifecycle.idle.suspendAfterSeconds is required: how long without a reader before suspending"]),
    ("fenced-by-of-257", {"nodeLoss": {"fencedBy": "f" * 257}},
     ["spec.nodeLoss.fencedBy must be 1 to 256 characters long, got 257"]),
    ("fenced-by-two-lines", {"nodeLoss": {"fencedBy": "ops\nteam"}},
     ["spec.nodeLoss.fencedBy has an invalid value 'ops\\nteam': it must be one line of text, "
      "without control characters"]),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "problems"), [(f, p) for _, f, p in REFUSED], ids=[i for i, _, _ in REFUSED])
def test_each_wrong_lifecycle_or_node_loss_field_is_refused_with_its_whole_sentence(
    fields: dict[str, Any], problems: list[str]
) -> None:
    assert refusal(**fields) == problems
