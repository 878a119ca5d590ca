"""The health port's bounds (``server/health.py``): what clients that trickle, never read, or hold
slow routes can take from the probes. Real sockets on 127.0.0.1, no TensorFlow."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tfdata_operator.server import health, probestate

# What a probe must answer within, whatever other clients do: the kubelet's timeout, as rendered
# (render/pod.py `_probe`). A 2-core machine running other tiers beside this one took over 1 s once.
PROBE_SECONDS = 2.0


@contextlib.contextmanager
def serving(**routes: Any) -> Iterator[health.HealthServer]:
    state = probestate.ProbeState("dispatcher starting")
    state.apply(probestate.status_line(probestate.RUNNING, True, "serving"))
    server = health.HealthServer(state, 0, host="127.0.0.1", **routes)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def read_reply(sock: socket.socket) -> tuple[int, str]:
    """The status and body of the reply on ``sock``, read to its end; (0, why) when there was none."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except OSError as exc:
        if not data:
            return 0, f"{type(exc).__name__}: {exc}"
    head, _, body = data.partition(b"\r\n\r\n")
    words = head.split(b" ", 2)
    return (int(words[1]), body.decode()) if len(words) > 1 else (0, f"no reply: {data!r}")


def ask(port: int, request: bytes, timeout: float = 5) -> tuple[int, str, float]:
    """One request on a new connection: (status, body, seconds until the whole reply)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        status, body = read_reply(sock)
    return status, body, time.monotonic() - started


def closed_by_server(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closes ``sock`` within ``timeout`` (what it sent before is read and dropped)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def is_open(sock: socket.socket) -> bool:
    """Whether the server still holds ``sock`` open, without a reply (a non-blocking socket)."""
    try:
        sock.recv(1, socket.MSG_PEEK)
        return False  # a reply, or the end
    except BlockingIOError:
        return True
    except OSError:
        return False


def probe(port: int) -> tuple[int, str, float]:
    return ask(port, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n", timeout=PROBE_SECONDS)


class SlowRoute:
    """A route that holds its thread until released; counts the calls that are holding one."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self._held = 0
        self._changed = threading.Condition()

    def __call__(self) -> probestate.Reply:
        with self._changed:
            self._held += 1
            self._changed.notify_all()
        self.release.wait(30)
        return probestate.Reply.text(200, "slow done")

    def wait_held(self, count: int) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: self._held >= count, timeout=10):
                raise AssertionError(f"{self._held} slow routes held a thread after 10s, not {count}")


def hold_pool(port: int, route: SlowRoute, count: int) -> list[socket.socket]:
    """``count`` connections whose requests are running ``route`` on the pool."""
    held = []
    for _ in range(count):
        sock = connect(port)
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        held.append(sock)
    route.wait_held(count)
    return held


# More than the connection cap, so the oldest make room for the rest.
DRIPPERS = 700


def test_dripping_connections_cost_no_thread_and_the_probes_answer_within_their_timeout() -> None:
    """700 clients each sending a byte every 0.5 s, and every pool thread held by a slow route:
    /readyz still answers 200 within the kubelet's timeout, each time, and the process's threads stay bounded
    (the old server started a thread per connection; the kubelet restarted the dispatcher)."""
    baseline = threading.active_count()
    slow = SlowRoute()
    drippers: list[socket.socket] = []
    stop = threading.Event()

    def drip() -> None:
        while not stop.wait(0.5):
            for sock in list(drippers):
                try:
                    sock.send(b"G")
                except OSError:  # closed by the server to make room, or at its deadline
                    drippers.remove(sock)

    with serving(get_routes={"/slow": slow}) as server:
        held = hold_pool(server.port, slow, health.ROUTE_WORKERS)
        dripping = threading.Thread(target=drip, daemon=True)
        dripping.start()
        try:
            for _ in range(DRIPPERS):
                sock = connect(server.port)
                sock.setblocking(False)
                drippers.append(sock)
            seen = [probe(server.port) for _ in range(15) if not stop.wait(0.2)]
            threads = threading.active_count()
            assert threads <= baseline + health.ROUTE_WORKERS + 3, f"{threads} threads (baseline {baseline})"
            # Held open while they trickle, up to the cap (the oldest made room for the others).
            trickling = sum(is_open(sock) for sock in list(drippers))
            assert trickling >= health.MAX_CONNECTIONS - health.ROUTE_WORKERS - 1, trickling
        finally:
            stop.set()
            slow.release.set()
            dripping.join(5)
            for sock in [*drippers, *held]:
                sock.close()
    # What the kubelet needs: no run of failed probes long enough to act on (readiness: 3 in a row,
    # render/pod.py). One probe of 15 may come late on a loaded machine: the drippers' thread
    # and this server share a process (and its GIL) here, which a pod's clients do not.
    failed = [status != 200 or seconds >= PROBE_SECONDS for status, _, seconds in seen]
    assert len(seen) == 15 and sum(failed) <= 1, seen


def test_a_request_that_drips_past_its_deadline_is_closed_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline is for the whole request, not for each read: a byte every 0.5 s does not keep
    the connection, whose end is a 408 at the deadline."""
    monkeypatch.setattr(health, "REQUEST_SECONDS", 2.0)
    with serving() as server, connect(server.port) as sock:
        started = time.monotonic()
        sock.settimeout(0.5)
        answer = b""
        for byte in b"GET /readyz HTTP/1.1\r\nX: aaaaaaaaaaaa":  # never whole: 17 s at this pace
            try:
                answer = sock.recv(65536)
                break  # the server answered (or closed) before the request was whole
            except TimeoutError:
                sock.send(bytes([byte]))
        answered_after = time.monotonic() - started
        assert closed_by_server(sock, 0.5)
    assert answer.startswith(b"HTTP/1.0 408 "), answer
    assert answer.endswith(b"\r\n\r\nthe request was not whole within 2s\n"), answer
    # At the deadline, give or take a loaded machine; the server's clock starts when it accepts, which
    # can be a little before this test's `started` (1.9997 s seen once).
    assert 1.9 <= answered_after < 4.0, answered_after


def test_a_client_that_does_not_read_its_reply_is_cut_off_at_the_reply_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    size = 16 * 1024 * 1024  # far more than the sockets' buffers hold (4 MiB at most on Linux by default)
    monkeypatch.setattr(health, "REPLY_SECONDS", 1.0)
    with serving(get_routes={"/big": lambda: probestate.Reply(200, b"x" * size)}) as server:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(2.0)  # the client reads nothing for longer than the reply deadline
            sock.settimeout(5)
            received = 0
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(1 << 20):
                    received += len(chunk)
        assert received < size, "the whole reply was kept for a client that did not read it"
        assert probe(server.port)[:2] == (200, "serving\n")


def test_a_full_pool_answers_503_at_once_and_the_probes_still_answer() -> None:
    slow = SlowRoute()
    with serving(get_routes={"/slow": slow, "/fast": lambda: probestate.Reply.text(200, "fast")}) as server:
        held = hold_pool(server.port, slow, health.ROUTE_WORKERS)
        try:
            status, body, seconds = ask(server.port, b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n", timeout=PROBE_SECONDS)
            assert (status, seconds < PROBE_SECONDS) == (503, True), (status, body, seconds)
            assert body == f"busy: all {health.ROUTE_WORKERS} request workers are in use; retry in a few seconds\n"
            status, body, seconds = probe(server.port)
            assert (status, body, seconds < PROBE_SECONDS) == (200, "serving\n", True), seconds
        finally:
            slow.release.set()
        assert [read_reply(sock) for sock in held] == [(200, "slow done\n")] * health.ROUTE_WORKERS
        for sock in held:
            sock.close()
        assert ask(server.port, b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\n")[:2] == (200, "fast\n")


def test_at_the_connection_cap_the_oldest_idle_connection_makes_room(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "MAX_CONNECTIONS", 4)
    with serving() as server:
        idle = [connect(server.port) for _ in range(4)]  # taken in before the probe: in their order
        try:
            assert probe(server.port)[:2] == (200, "serving\n")
            assert closed_by_server(idle[0], 2), "the oldest idle connection was not closed"
            assert not closed_by_server(idle[3], 0.2), "the youngest idle connection was closed"
        finally:
            for sock in idle:
                sock.close()


def test_at_the_connection_cap_with_none_idle_a_new_connection_gets_503(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "MAX_CONNECTIONS", 3)
    monkeypatch.setattr(health, "ROUTE_WORKERS", 3)
    slow = SlowRoute()
    with serving(get_routes={"/slow": slow}) as server:
        held = hold_pool(server.port, slow, 3)
        try:
            status, body, seconds = probe(server.port)
            assert (status, body) == (503, "busy: 3 connections are open; retry in a few seconds\n"), body
            assert seconds < PROBE_SECONDS
        finally:
            slow.release.set()
            for sock in held:
                sock.close()


@pytest.mark.parametrize(
    ("request_bytes", "status", "body"),
    [
        (b"POST /v1/x HTTP/1.1\r\n\r\n", 404, "not found: POST goes to /r"),
        (b"POST /r HTTP/1.1\r\n\r\n", 411, "a POST needs a Content-Length header"),
        (
            b"POST /r HTTP/1.1\r\nContent-Length: 70000\r\n\r\n" + b"x" * 70000,  # answered before the body is read
            413,
            "the body may be at most 65536 bytes, got 70000",
        ),
        (b"POST /r?x=1 HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 200, "got hello"),
        (b"DELETE /d?path=/a HTTP/1.1\r\n\r\n", 200, "deleted path=/a"),
        (b"DELETE /r HTTP/1.1\r\n\r\n", 404, "not found: DELETE goes to /d"),
        (b"GET /q?a=b HTTP/1.1\r\n\r\n", 200, "query a=b"),
        (b"GET /nope HTTP/1.0\r\n\r\n", 404, "not found: try /boom, /healthz, /q, /readyz"),
        (b"GET /boom HTTP/1.1\r\n\r\n", 500, "GET /boom failed: a bug"),
        (b"PUT /r HTTP/1.1\r\n\r\n", 501, "unsupported method PUT: GET, POST and DELETE are"),
        (b"nonsense\r\n\r\n", 400, "bad request line: b'nonsense\\r\\n'"),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", 431, "the request line and headers may be at most"),
    ],
    ids=["post-404", "411", "413", "post", "delete", "delete-404", "query", "get-404", "500", "501", "400", "431"],
)
def test_the_answers_to_each_kind_of_request(request_bytes: bytes, status: int, body: str) -> None:
    def boom() -> probestate.Reply:
        raise RuntimeError("a bug")

    routes = {
        "get_routes": {"/boom": boom},
        "post_routes": {"/r": lambda data: probestate.Reply.text(200, f"got {data.decode()}")},
        "query_routes": {"/q": lambda query: probestate.Reply.text(200, f"query {query}")},
        "delete_routes": {"/d": lambda query: probestate.Reply.text(200, f"deleted {query}")},
    }
    with serving(**routes) as server:
        got_status, got_body, _ = ask(server.port, request_bytes)
    assert (got_status, got_body.startswith(body)) == (status, True), got_body


def test_a_connection_left_pending_when_the_loop_closes_logs_no_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """Found on kind (a thawed node's dispatcher, at its stop): a connection whose task had not ended
    when the stop's wait gave up was closed with the loop's garbage, and its cleanup raised "Event loop
    is closed" into the log. Here the stop waits for nothing, so the task is left pending."""
    import asyncio
    import gc
    import sys

    async def gives_up(tasks: Any, timeout: float) -> Any:  # the stop's wait, timed out at once
        return set(), set(tasks)

    raised: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: raised.append(unraisable.exc_value))
    with serving() as server, connect(server.port) as sock:
        sock.sendall(b"GET /readyz HTTP/1.1\r\n")  # not whole: the connection waits for the rest
        time.sleep(0.3)
        monkeypatch.setattr(asyncio, "wait", gives_up)
        server.stop()
        server._open.clear()  # the stop's own references: the pending task goes with the garbage
        server._evictable.clear()
        gc.collect()
    logged = caplog.text + "".join(capfd.readouterr())
    assert "Task was destroyed but it is pending" in logged, logged  # the case happened
    assert "Event loop is closed" not in logged + "".join(map(str, raised)), (logged, raised)
