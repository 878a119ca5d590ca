"""The Events the operator records (controller/kube.py's ``Kube.event``): what `kubectl describe` shows."""

from __future__ import annotations

from typing import Any

from tfdata_operator.controller.kube import Kube

SERVICE = {
    "apiVersion": "tfdata.dev/v1alpha1",
    "kind": "TFDataService",
    "metadata": {"name": "demo", "namespace": "ml", "uid": "uid-1", "resourceVersion": "5"},
}


class Recorded(Kube):
    """A Kube whose requests are recorded and answered as the API server would."""

    def __init__(self) -> None:
        super().__init__(api=None, counted=False)
        self.requests: list[tuple[str, str, Any]] = []

    def call(self, method: str, url: str, body: Any = None, **_: Any) -> dict[str, Any]:
        self.requests.append((method, url, body))
        return {"metadata": {"name": f"demo.{len(self.requests)}", "namespace": "ml"}}


def test_an_events_message_is_one_clean_line_of_at_most_1024_characters() -> None:
    kube = Recorded()
    kube.event(SERVICE, "Warning", "ServerNotReady", "readyz:\n\x1b[31mno journal\x1b[0m\x07 " + "x" * 2000)
    ((method, url, posted),) = kube.requests
    assert (method, url) == ("POST", "/api/v1/namespaces/ml/events")
    assert posted["message"].startswith("readyz: no journal xxx") and posted["message"].endswith("x…")
    assert len(posted["message"]) == 1024
