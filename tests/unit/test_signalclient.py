"""Reading a dispatcher's /v1/signals: straight from the pod's IP, else through the API server's proxy."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from support import service_signals

from tfdata_operator.signalclient import SignalClient
from tfdata_operator.signals import SIGNALS_PATH, SignalsError

SIGNALS = service_signals(reading=True)


@pytest.fixture
def dispatcher() -> Iterator[int]:
    """A health port that answers /v1/signals like a dispatcher pod's, on 127.0.0.1."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = SIGNALS.to_json().encode() if self.path == SIGNALS_PATH else b"not here"
            self.send_response(200 if self.path == SIGNALS_PATH else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pod(ip: str | None = "127.0.0.1") -> dict[str, Any]:
    return {"metadata": {"name": "demo-dispatcher-0", "namespace": "ml"}, "status": {"podIP": ip}}


class FakeProxy:
    def __init__(self, answer: bytes | None) -> None:
        self.answer, self.calls = answer, []  # type: ignore[var-annotated]

    def proxy_get(self, namespace: str, name: str, port: int, path: str) -> bytes:
        self.calls.append((namespace, name, port, path))
        if self.answer is None:
            raise ApiException(status=503, body='{"message": "no endpoints available"}')
        return self.answer


def test_reads_the_pod_directly_without_the_api_server(dispatcher: int) -> None:
    proxy = FakeProxy(None)
    assert SignalClient(proxy)(pod(), dispatcher) == SIGNALS
    assert proxy.calls == []


def test_falls_back_to_the_api_server_proxy_where_the_pod_is_not_routable() -> None:
    proxy = FakeProxy(SIGNALS.to_json().encode())
    port = closed_port()
    assert SignalClient(proxy, timeout=1)(pod(), port) == SIGNALS
    assert proxy.calls == [("ml", "demo-dispatcher-0", port, SIGNALS_PATH)]
    assert SignalClient(proxy)(pod(ip=None), port) == SIGNALS


def test_says_why_when_neither_way_answers() -> None:
    with pytest.raises(SignalsError) as raised:
        SignalClient(FakeProxy(None), timeout=1)(pod(), closed_port())
    assert "refused" in str(raised.value) and "no endpoints available" in str(raised.value)


def test_a_document_that_is_not_signals_is_refused() -> None:
    with pytest.raises(SignalsError, match="must be a JSON object"):
        SignalClient(FakeProxy(b"<html>"), timeout=1)(pod(), closed_port())
