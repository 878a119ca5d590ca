"""Reading a dispatcher's /v1/signals over real HTTP on 127.0.0.1, and the per-service windows."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace

import pytest
from prometheus_client import REGISTRY

from tfdata_operator.autoscaling import policy as autoscaler
from tfdata_operator.autoscaling import readings as signalsource
from tfdata_operator.autoscaling.policy import Policy
from tfdata_operator.controller import probes
from tfdata_operator.server.health import HealthServer
from tfdata_operator.server.probestate import RUNNING, ProbeState, status_line
from tfdata_operator.wire.signals import SIGNALS_PATH
from tfdata_operator.wire.snapshots import SnapshotProgress, SnapshotsReport

from fixtures.cases import STALLED_SIGNALS

SIGNALS = STALLED_SIGNALS
POLICY = Policy(
    min_replicas=1, max_replicas=4, scale_down_always=False, window_seconds=60, saturated_cpu=0.8, stalled=0.1
)

Handler = Callable[[http.server.BaseHTTPRequestHandler], None]


@pytest.fixture
def dispatcher() -> Iterator[Callable[[Handler], str]]:
    """A real HTTP server on 127.0.0.1 that answers with ``handler``; returns the signals URL."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def serve(handler: Handler) -> str:
        class Answer(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                handler(self)

            def log_message(self, *_: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}{SIGNALS_PATH}"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def reply(status: int, body: bytes) -> Handler:
    def handle(request: http.server.BaseHTTPRequestHandler) -> None:
        request.send_response(status)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)

    return handle


def test_reads_the_signals(dispatcher: Callable[[Handler], str]) -> None:
    assert probes.fetch(dispatcher(reply(200, SIGNALS.to_json().encode()))) == SIGNALS


def test_every_read_is_counted_by_whether_it_answered(dispatcher: Callable[[Handler], str]) -> None:
    def count(answered: str) -> float:
        return REGISTRY.get_sample_value("tfdata_operator_signal_reads_total", {"answered": answered}) or 0.0

    before = count("true"), count("false")
    probes.fetch(dispatcher(reply(200, SIGNALS.to_json().encode())))
    probes.fetch(dispatcher(reply(503, b"starting")))
    probes.fetch(dispatcher(reply(503, b"starting")))
    assert (count("true") - before[0], count("false") - before[1]) == (1, 2)


def test_a_newer_dispatcher_may_add_fields(dispatcher: Callable[[Handler], str]) -> None:
    body = json.dumps({**asdict(SIGNALS), "worker_queue_depth": 12.5}).encode()
    assert probes.fetch(dispatcher(reply(200, body))) == SIGNALS


@pytest.mark.parametrize(
    ("status", "body", "says"),
    [
        (503, b"starting", "answered 503"),
        (200, b"<html>", "signals must be a JSON object"),
        (200, json.dumps({"reading": True}).encode(), "missing fields in signals"),
        (200, b"{" + b" " * probes.MAX_BYTES + b"}", "more than 262144 bytes"),
    ],
    ids=["error status", "not JSON", "another version", "too large"],
)
def test_a_bad_answer_is_described_not_raised(
    dispatcher: Callable[[Handler], str], status: int, body: bytes, says: str
) -> None:
    result = probes.fetch(dispatcher(reply(status, body)))
    assert isinstance(result, str) and says in result, result


def test_a_dispatcher_that_is_not_there_is_described(dispatcher: Callable[[Handler], str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens
    result = probes.fetch(f"http://127.0.0.1:{port}{SIGNALS_PATH}")
    assert isinstance(result, str) and "Connection refused" in result, result


def test_a_dispatcher_that_hangs_costs_only_the_timeout(dispatcher: Callable[[Handler], str]) -> None:
    release = threading.Event()

    def hang(request: http.server.BaseHTTPRequestHandler) -> None:
        release.wait(10)

    url = dispatcher(hang)
    started = time.monotonic()
    try:
        result = probes.fetch(url, timeout=0.3)
    finally:
        release.set()
    assert isinstance(result, str) and "timed out" in result, result
    assert time.monotonic() - started < 3


def test_a_connection_dropped_mid_answer_is_described(dispatcher: Callable[[Handler], str]) -> None:
    def drop(request: http.server.BaseHTTPRequestHandler) -> None:
        request.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{")
        request.wfile.flush()
        request.connection.shutdown(socket.SHUT_RDWR)

    result = probes.fetch(dispatcher(drop))
    assert isinstance(result, str) and "ended 499 bytes short of its Content-Length" in result, result


@pytest.mark.parametrize(
    ("head", "each", "read"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n", b" ", probes.fetch),
        (b"HTTP/1.1 200 OK\r\n", b"X-Slow: 1\r\n", probes.fetch),
        (b"HTTP/1.1 503 Unavailable\r\n", b"X-Slow: 1\r\n", probes.read_readiness),
    ],
    ids=["body", "headers", "readiness headers"],
)
def test_a_pod_that_drips_is_cut_off_at_the_deadline_for_the_whole_answer(
    dispatcher: Callable[[Handler], str], head: bytes, each: bytes, read: Callable[..., object]
) -> None:
    """A line every 0.2 s never lets one socket read time out; the deadline is for the exchange."""
    release = threading.Event()

    def drip(request: http.server.BaseHTTPRequestHandler) -> None:
        request.wfile.write(head)
        while not release.wait(0.2):
            try:
                request.wfile.write(each)
                request.wfile.flush()
            except OSError:
                return

    url = dispatcher(drip)
    started = time.monotonic()
    try:
        result = read(url, timeout=1.0)
        took = time.monotonic() - started
    finally:
        release.set()
    assert result is None or (isinstance(result, str) and "no whole answer within 1s" in result), result
    assert took < 2.5, took


def test_a_redirect_is_never_followed(dispatcher: Callable[[Handler], str]) -> None:
    """A pod's answer must not send the operator elsewhere (the cloud's metadata server, a
    kubelet), nor bring that place's text back into the pod's own status."""
    visited: list[str] = []

    def secret(request: http.server.BaseHTTPRequestHandler) -> None:
        visited.append(request.path)
        reply(200, b"the-secret-text")(request)

    elsewhere = dispatcher(secret)

    def redirect(request: http.server.BaseHTTPRequestHandler) -> None:
        request.send_response(302)
        request.send_header("Location", elsewhere)
        request.send_header("Content-Length", "0")
        request.end_headers()

    url = dispatcher(redirect)
    signals = probes.fetch(url)
    assert isinstance(signals, str) and "answered 302" in signals, signals
    assert probes.read_readiness(url) is None
    deleted = probes.delete_snapshot(url)
    assert deleted is not None and "the-secret-text" not in deleted
    assert visited == []


def test_a_long_reason_phrase_is_cut(dispatcher: Callable[[Handler], str]) -> None:
    def shout(request: http.server.BaseHTTPRequestHandler) -> None:
        request.wfile.write(b"HTTP/1.1 503 " + b"A" * 60_000 + b"\r\nContent-Length: 0\r\n\r\n")

    result = probes.fetch(dispatcher(shout))
    assert isinstance(result, str) and "answered 503" in result and len(result) < 300, result[:300]


def test_only_http_addresses_are_read() -> None:
    result = probes.fetch("file:///etc/passwd")
    assert isinstance(result, str) and "not an http:// address" in result, result


def test_reads_the_snapshots_and_counts_each_read(dispatcher: Callable[[Handler], str]) -> None:
    def count(answered: str) -> float:
        return REGISTRY.get_sample_value("tfdata_operator_snapshot_reads_total", {"answered": answered}) or 0.0

    report = SnapshotsReport((SnapshotProgress("gs://b/s", "IN_PROGRESS", journaled=True, chunks=2),), "journal")
    before = count("true"), count("false")
    assert probes.fetch_snapshots(dispatcher(reply(200, report.to_json().encode()))) == report
    refused = probes.fetch_snapshots(dispatcher(reply(503, b"starting")))
    assert isinstance(refused, str) and "answered 503" in refused
    other = probes.fetch_snapshots(dispatcher(reply(200, b'{"snapshots": 3, "journal": ""}')))
    assert isinstance(other, str) and "snapshots must be a list" in other
    assert (count("true") - before[0], count("false") - before[1]) == (1, 2)


# --- Windows ----------------------------------------------------------------------------------


def test_a_window_keeps_what_decisions_look_at_and_no_more() -> None:
    windows = signalsource.Windows()
    keep = autoscaler.retention_seconds(POLICY)
    for i in range(200):
        windows.record(("ml", "a"), i * 5.0, SIGNALS, POLICY)
    samples = windows.get(("ml", "a")).samples
    assert samples[-1].at == 995.0
    assert samples[0].at >= 995.0 - keep and samples[0].at - 5.0 < 995.0 - keep
    # However often a service is read, the window has a fixed ceiling.
    for i in range(signalsource.MAX_SAMPLES + 50):
        windows.record(("ml", "b"), 1000 + i * 0.001, SIGNALS, POLICY)
    assert len(windows.get(("ml", "b")).samples) == signalsource.MAX_SAMPLES
    windows.forget(("ml", "b"))
    assert len(windows) == 1


def test_decisions_carry_their_memory_and_their_pace() -> None:
    windows = signalsource.Windows()
    key = ("ml", "a")
    assert windows.due(key, 0.0)
    decision = None
    for at in range(0, 60, 5):
        decision = windows.decide(key, POLICY, 2, SIGNALS, float(at))
        if decision.scales:
            break
    assert decision is not None and decision.replicas == 4
    assert "trainers waited on data 38% of the time, workers at 95% CPU" in decision.reason
    window = windows.get(key)
    assert window.history == decision.history and window.latest == SIGNALS
    assert not windows.due(key, at + decision.next_check_seconds - 0.1)
    assert windows.due(key, at + decision.next_check_seconds)


def test_a_failed_read_is_kept_out_of_the_window_and_said_in_the_reason() -> None:
    windows = signalsource.Windows()
    key = ("ml", "a")
    windows.decide(key, POLICY, 2, replace(SIGNALS, client_stall_fraction_mean=0.02), 0.0)
    decision = windows.decide(key, POLICY, 2, "GET http://x/v1/signals failed: [Errno 111] Connection refused", 5.0)
    assert len(windows.get(key).samples) == 1
    assert decision.replicas == 2
    assert decision.reason.endswith(
        "; the last read failed: GET http://x/v1/signals failed: [Errno 111] Connection refused"
    )
    # Without a fresh reading the decision holds, and says so.
    stale = windows.decide(key, POLICY, 2, "GET http://x/v1/signals answered 503 Service Unavailable", 60.0)
    assert stale.replicas == 2 and "no recent signals from the dispatcher (last read 60s ago)" in stale.reason


def test_a_servers_readiness_detail_is_read_from_its_real_probe_endpoint() -> None:
    state = ProbeState("starting")
    detail = "dispatcher serving on port 5050; 2 of 3 workers registered: waiting for every listed worker to register"
    state.apply(status_line(RUNNING, False, detail))
    server = HealthServer(state, 0, host="127.0.0.1")
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/readyz"
        assert probes.read_readiness(url) == f"not ok: running: {detail}"
        state.apply(status_line(RUNNING, True, "dispatcher serving on port 5050; 3 of 3 workers registered"))
        assert probes.read_readiness(url) == "dispatcher serving on port 5050; 3 of 3 workers registered"
    finally:
        server.stop()
    assert probes.read_readiness(url, timeout=0.5) is None  # nobody there: nothing to say
