"""spec/pods.py: the parts of a server pod a user sets, here the labels Kueue owns, which a pod must not carry."""

from __future__ import annotations

import pytest

from tfdata_operator.api import kueue, spec

from fixtures.cases import parse


def test_every_kueue_label_on_the_pods_is_named_in_one_sentence() -> None:
    with pytest.raises(spec.SpecError) as err:
        parse(dispatcher={"labels": {kueue.QUEUE_LABEL: "team-a", kueue.PRIORITY_LABEL: "high", "team": "vision"}})
    assert err.value.problems == [
        "spec.dispatcher.labels must not set kueue.x-k8s.io/priority-class, kueue.x-k8s.io/queue-name: on the "
        "service's StatefulSets and pods Kueue would queue and freeze them one by one; label the TFDataService "
        "itself (kueue.x-k8s.io/queue-name) to have it admitted through Kueue as one workload (docs/training-runs.md)"
    ]
