"""The Events the operator records (controller/kube.py's ``Kube.event``): what `kubectl describe` shows."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tfdata_operator.controller import kube as kubemodule
from tfdata_operator.controller.kube import Kube

from fixtures.manifests import API_VERSION

SERVICE = {
    "apiVersion": API_VERSION,
    "kind": "TFDataService",
    "metadata": {"name": "demo", "namespace": "ml", "uid": "uid-1", "resourceVersion": "5"},
}


class Recorded(Kube):
    """A Kube whose requests are recorded and answered as the API server would."""

    def __init__(self) -> None:
        super().__init__(api=None, counted=False)
        self.requests: list[tuple[str, str, Any]] = []
        self.expired: dict[str, int] = {}  # Events that cannot be patched: the API server's answer

    def call(self, method: str, url: str, body: Any = None, **_: Any) -> dict[str, Any]:
        self.requests.append((method, url, body))
        if method == "PATCH" and (refusal := self.expired.get(url.rsplit("/", 1)[1])):
            raise ApiException(status=refusal, reason="Refused")
        return {"metadata": {"name": f"demo.{len(self.requests)}", "namespace": "ml"}}

    def take(self) -> list[tuple[str, str, Any]]:
        taken, self.requests = self.requests, []
        return taken


def test_an_events_message_is_one_clean_line_of_at_most_1024_characters() -> None:
    kube = Recorded()
    kube.event(SERVICE, "Warning", "ServerNotReady", "readyz:\n\x1b[31mno journal\x1b[0m\x07 " + "x" * 2000)
    ((method, url, posted),) = kube.requests
    assert (method, url) == ("POST", "/api/v1/namespaces/ml/events")
    assert posted["message"].startswith("readyz: no journal xxx") and posted["message"].endswith("x…")
    assert len(posted["message"]) == 1024


def test_the_same_event_again_counts_up_on_the_first_instead_of_adding_one() -> None:
    kube = Recorded()
    for _ in range(3):
        kube.event(SERVICE, "Warning", "InvalidSpec", "Invalid spec: spec.image is required")
    created, *again = kube.take()
    assert created[0] == "POST" and created[2]["count"] == 1
    assert [(method, url, body["count"]) for method, url, body in again] == [
        ("PATCH", "/api/v1/namespaces/ml/events/demo.1", 2),
        ("PATCH", "/api/v1/namespaces/ml/events/demo.1", 3),
    ]
    assert set(again[0][2]) == {"count", "lastTimestamp"}
    # Another message, reason, type or object is an Event of its own.
    other = {**SERVICE, "metadata": {**SERVICE["metadata"], "name": "other", "uid": "uid-2"}}
    kube.event(SERVICE, "Warning", "InvalidSpec", "Invalid spec: spec.workers.replicas is too large")
    kube.event(SERVICE, "Warning", "NameConflict", "Invalid spec: spec.image is required")
    kube.event(SERVICE, "Normal", "InvalidSpec", "Invalid spec: spec.image is required")
    kube.event(other, "Warning", "InvalidSpec", "Invalid spec: spec.image is required")
    assert [method for method, _, _ in kube.take()] == ["POST"] * 4


@pytest.mark.parametrize("refusal", [404, 403], ids=["dropped after its TTL", "a role without patch"])
def test_an_event_that_cannot_count_up_is_recorded_anew(refusal: int) -> None:
    kube = Recorded()
    kube.event(SERVICE, "Normal", "Scaled", "Scaled workers from 2 to 4")
    kube.expired["demo.1"] = refusal
    kube.event(SERVICE, "Normal", "Scaled", "Scaled workers from 2 to 4")
    kube.event(SERVICE, "Normal", "Scaled", "Scaled workers from 2 to 4")
    assert [(method, url.rsplit("/", 1)[1], body["count"]) for method, url, body in kube.take()] == [
        ("POST", "events", 1),
        ("PATCH", "demo.1", 2),
        ("POST", "events", 1),
        ("PATCH", "demo.3", 2),
    ]


def test_the_events_remembered_are_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr(kubemodule, "MAX_REMEMBERED_EVENTS", 2)
    kube = Recorded()
    for n in (1, 2, 3, 1):
        kube.event(SERVICE, "Normal", "Scaled", f"Scaled workers to {n}")
    assert len(kube.recorded) == 2
    # The first was forgotten when the third came: said again, it is a new Event.
    assert [method for method, _, _ in kube.take()] == ["POST"] * 4
