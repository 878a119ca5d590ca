"""spec/service.py's own reading of the TFDataService: the Kueue labels on its metadata (the LocalQueue
that admits it and its priority class), their bounds and the whole sentence of each refusal."""

from __future__ import annotations

import pytest

from tfdata_operator.api import kueue, spec

from fixtures.cases import IMAGE, body

SAYS = "must name a Kueue object (lowercase letters, digits and '-', at most 63 characters)"


def parse_labelled(labels: dict[str, object]) -> spec.ServiceSpec:
    doc = body(shardingPolicy="DYNAMIC")
    doc["metadata"]["labels"] = labels
    return spec.parse(doc, IMAGE)


def test_a_queue_and_a_priority_class_of_63_characters_are_taken() -> None:
    svc = parse_labelled({kueue.QUEUE_LABEL: "q" * 63, kueue.PRIORITY_LABEL: "p" * 63})
    assert svc.kueue == spec.KueueSpec(queue="q" * 63, priority_class="p" * 63)


@pytest.mark.parametrize("label", [kueue.QUEUE_LABEL, kueue.PRIORITY_LABEL])
@pytest.mark.parametrize("value", ["k" * 64, 5], ids=["64-characters", "not-a-string"])
def test_a_kueue_label_too_long_or_not_a_string_is_refused_with_its_value(label: str, value: object) -> None:
    labels: dict[str, object] = {kueue.QUEUE_LABEL: "team-a", label: value}
    with pytest.raises(spec.SpecError) as err:
        parse_labelled(labels)
    assert err.value.problems == [f"metadata.labels[{label}] {SAYS}, got {value!r}"]


def test_a_priority_class_without_a_queue_is_refused_saying_to_set_both_or_neither() -> None:
    with pytest.raises(spec.SpecError) as err:
        parse_labelled({kueue.PRIORITY_LABEL: "high"})
    assert err.value.problems == [
        "metadata.labels[kueue.x-k8s.io/priority-class] needs kueue.x-k8s.io/queue-name: a priority class applies "
        "to a service admitted through a Kueue LocalQueue; set both, or neither"
    ]
