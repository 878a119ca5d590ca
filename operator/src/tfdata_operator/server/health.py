"""The HTTP port of a dispatcher or worker pod: ``/healthz``, ``/readyz`` and more.

Served by the supervisor process (standard library only), from the state the TensorFlow
process reports over a pipe (kept in ``probestate.ProbeState``), one JSON object per line::

    {"phase": "starting" | "running" | "failed" | "cannot-serve", "ready": true | false,
     "detail": "...", "stats": {"tasks": 1}, "info": {...}, "snapshots_port": 41234}

(``stats``, optional: the numbers only the TensorFlow process can read, for ``metrics``;
``info``, once: the ``serverinfo.ServerInfo`` it measured after its preloads;
``snapshots_port``, a dispatcher's: where on 127.0.0.1 it answers ``/v1/snapshots``, see
``snapshots``.)

- ``/healthz`` is 200 while the server is starting, running or stopping, and 503 once it
  has failed: a liveness probe restarts a pod whose server cannot start.
- ``/readyz`` is 200 only while the TensorFlow process says it is ready and has said so
  recently; otherwise 503, and the body says why.
- A server that cannot serve in this image as configured (a preload failed) stays alive and
  unready: a restart would fail the same way, and a crash loop would hide the reason behind
  its back-off, where ``/readyz`` says it (the operator quotes it in the service's conditions).
- ``serverinfo.INFO_PATH`` serves the ServerInfo as JSON, 503 until the TensorFlow process
  has measured it.
- ``DELETE`` goes to the routes given for it, with the query string (a dispatcher's snapshots).

Every client is untrusted (a trainer's pod reaches this port): one asyncio loop reads each request
whole, within ``REQUEST_SECONDS`` of its connection, and writes each reply, within
``REPLY_SECONDS``, so a client that trickles costs a socket and no thread; at ``MAX_CONNECTIONS``
the oldest connection still sending its request makes room for a new one. ``/healthz`` and
``/readyz`` are answered on the loop, from memory; the other routes run on at most
``ROUTE_WORKERS`` threads, and beyond them get 503 at once: a slow DELETE, or a client that holds
every thread, never delays the probes the kubelet restarts the pod on.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import http.client
import io
import logging
import queue
import socket
import threading
from collections.abc import Callable, Mapping
from http import HTTPStatus

from tfdata_operator.server import LOGGER_NAME
from tfdata_operator.server.probestate import GetRoute, PostRoute, ProbeState, QueryRoute, Reply

# A request body larger than this is refused (413): a client report is a few hundred bytes.
MAX_BODY_BYTES = 64 * 1024

# The bounds of the health port: what a client that trickles, never reads, or holds slow routes can
# take. The whole request (request line, headers, body) must arrive within REQUEST_SECONDS of the
# connection (408 after), not within that long of each read; the reply must be taken within
# REPLY_SECONDS (then the connection is closed).
REQUEST_SECONDS = 10.0
REPLY_SECONDS = 10.0
# Open connections at most, well inside the 1,024 file descriptors a container may be given. At
# the cap a new one closes the oldest that closing loses no answer to (still sending its request, or
# answered); when every connection waits on a route or takes its reply, the new one gets 503.
MAX_CONNECTIONS = 512
# Threads that run routes (a DELETE /v1/snapshots waits on its store's listing); a route asked beyond gets 503
# at once. The probes never wait for one.
ROUTE_WORKERS = 32
# The request line and headers at most (431 beyond), as http.server's 64 KiB line and 100 headers.
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
LISTEN_BACKLOG = 128
# How long an answered connection waits for the client to close it (see HealthServer._linger).
LINGER_SECONDS = 1.0


class _RoutePool:
    """At most ``size`` daemon threads that run routes. A full pool refuses a route, never queues it:
    a queue would only make the caller wait longer for the same 503. Used from the loop's thread."""

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self.size = size
        self.busy = 0
        self._loop = loop
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Reply], asyncio.Future[Reply]] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def submit(self, work: Callable[[], Reply]) -> asyncio.Future[Reply] | None:
        """The route's future reply, or None when every thread is taken."""
        if self.busy >= self.size:
            return None
        self.busy += 1
        if self.busy > len(self._threads):  # threads start as they are first needed
            thread = threading.Thread(target=self._work, name=f"health-route-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()
        future = self._loop.create_future()
        self._jobs.put((work, future))
        return future

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            work, future = job
            reply = work()
            try:
                self._loop.call_soon_threadsafe(self._done, future, reply)
            except RuntimeError:  # the loop is closed: the server has stopped
                return

    def _done(self, future: asyncio.Future[Reply], reply: Reply) -> None:
        self.busy -= 1
        if not future.done():  # not when its connection was closed meanwhile
            future.set_result(reply)

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)


# What a request read asks for: a reply at once, a route for the pool, or nothing (the client left).
_Answer = Reply | Callable[[], Reply] | None


class HealthServer:
    """An HTTP server for the probes and the routes given, on its own daemon thread: one request
    per connection (as HTTP/1.0), within the bounds above (see the module's docstring)."""

    def __init__(
        self,
        state: ProbeState,
        port: int,
        host: str = "0.0.0.0",
        get_routes: Mapping[str, GetRoute] | None = None,
        post_routes: Mapping[str, PostRoute] | None = None,
        query_routes: Mapping[str, QueryRoute] | None = None,
        delete_routes: Mapping[str, QueryRoute] | None = None,
    ) -> None:
        def probe(check: Callable[[], tuple[bool, str]]) -> GetRoute:
            def answer() -> Reply:
                ok, detail = check()
                return Reply.text(200 if ok else 503, detail if ok else f"not ok: {detail}")

            return answer

        # Answered on the loop, from memory: never behind a busy pool.
        self._probes: dict[str, GetRoute] = {"/healthz": probe(state.liveness), "/readyz": probe(state.readiness)}
        self._gets: dict[str, GetRoute] = {**self._probes, **(get_routes or {})}
        self._posts = dict(post_routes or {})
        self._queries = dict(query_routes or {})
        self._deletes = dict(delete_routes or {})
        # Read here, not at import: a test may lower them.
        self._request_seconds = REQUEST_SECONDS
        self._reply_seconds = REPLY_SECONDS
        self._max_connections = MAX_CONNECTIONS

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
            self._sock.listen(LISTEN_BACKLOG)
        except OSError:
            self._sock.close()
            raise
        self._loop = asyncio.new_event_loop()
        self._stopped: asyncio.Future[None] = self._loop.create_future()
        self._pool = _RoutePool(ROUTE_WORKERS, self._loop)
        # Every open connection's task; and, oldest first, those that closing loses no answer to:
        # still sending their request, or answered and waiting for the client to close.
        self._open: dict[asyncio.Task[None], asyncio.WriteTransport] = {}
        self._evictable: dict[asyncio.Task[None], asyncio.WriteTransport] = {}
        self._thread = threading.Thread(target=self._run, name="health", daemon=True)

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop_serving)
            self._thread.join(5)
        elif self._thread.ident is None:  # never started
            self._loop.close()
        self._sock.close()
        self._pool.close()

    def _stop_serving(self) -> None:
        if not self._stopped.done():
            self._stopped.set_result(None)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._connection, sock=self._sock, limit=MAX_HEAD_BYTES)
        await self._stopped
        server.close()
        tasks = list(self._open)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1)

    def _make_room(self) -> bool:
        """At the cap, closes the evictable connection that is oldest (a slow client, or one that
        sends nothing): a flood of them must not keep a probe out. False when there is none."""
        if len(self._open) < self._max_connections:
            return True
        if not self._evictable:
            return False  # every connection waits on a route or takes its reply
        task, transport = next(iter(self._evictable.items()))  # a dict keeps the order of insertion
        del self._evictable[task], self._open[task]
        task.cancel()
        transport.abort()
        return True

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transport = writer.transport
        if not self._make_room():
            busy = Reply.text(503, f"busy: {self._max_connections} connections are open; retry in a few seconds")
            transport.write(_encode(busy))
            transport.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._open[task] = self._evictable[task] = transport
        try:
            try:
                answer = await asyncio.wait_for(self._read(reader), self._request_seconds)
            except asyncio.TimeoutError:
                answer = Reply.text(408, f"the request was not whole within {self._request_seconds:g}s")
            finally:
                self._evictable.pop(task, None)
            if answer is None:
                return
            if not isinstance(answer, Reply):
                future = self._pool.submit(answer)
                if future is None:
                    answer = Reply.text(
                        503, f"busy: all {self._pool.size} request workers are in use; retry in a few seconds"
                    )
                else:
                    answer = await future
            if await self._write(writer, answer):
                self._evictable[task] = transport
                await self._linger(reader)
        except Exception:  # a bug here must not take the loop, and the probes, down
            logging.getLogger(LOGGER_NAME).exception("serving a connection on the health port failed")
        finally:
            self._open.pop(task, None)
            self._evictable.pop(task, None)
            # A connection the stop did not see end (its task still pending when the loop closed) is
            # closed with the loop's garbage: aborting then would raise "Event loop is closed" into
            # the log, a traceback with nothing wrong (found on kind, a thawed node's dispatcher).
            if not self._loop.is_closed():
                transport.abort()

    async def _write(self, writer: asyncio.StreamWriter, reply: Reply) -> bool:
        """Writes the reply and its end; False when the client did not take it within ``REPLY_SECONDS``."""
        writer.transport.set_write_buffer_limits(high=0)  # drain() waits until the kernel has every byte
        writer.write(_encode(reply))
        try:
            await asyncio.wait_for(writer.drain(), self._reply_seconds)
        except (asyncio.TimeoutError, ConnectionError):
            return False
        if writer.can_write_eof():
            writer.write_eof()
        return True

    @staticmethod
    async def _linger(reader: asyncio.StreamReader) -> None:
        """Reads what the client still sends (a body not read) until it closes, for ``LINGER_SECONDS``
        at most: closing with bytes unread would reset the connection, and the client could lose the
        reply before it reads it."""
        with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
            await asyncio.wait_for(_discard(reader), LINGER_SECONDS)

    async def _read(self, reader: asyncio.StreamReader) -> _Answer:
        """Reads one request; answers it or says which route does."""
        try:
            lines: list[bytes] = []
            size = 0
            while not lines or lines[-1] not in (b"\r\n", b"\n"):
                line = await reader.readline()
                if not line.endswith(b"\n"):
                    return None  # the client closed before the end of its headers
                if not lines and not line.strip():
                    continue  # blank lines before a request line are allowed (RFC 9112, 2.2)
                lines.append(line)
                size += len(line)
                if size > MAX_HEAD_BYTES or len(lines) > MAX_HEADERS + 2:
                    return _HEAD_TOO_LARGE
        except ValueError:  # one line beyond MAX_HEAD_BYTES
            return _HEAD_TOO_LARGE
        except ConnectionError:
            return None
        words = lines[0].decode("latin-1").split()
        if len(words) != 3 or not words[2].startswith("HTTP/"):
            return Reply.text(400, f"bad request line: {lines[0][:100]!r}")
        method, target, _ = words
        try:
            headers = http.client.parse_headers(io.BytesIO(b"".join(lines[1:])))
        except http.client.HTTPException:
            return _HEAD_TOO_LARGE
        path, _, query = target.partition("?")
        if method == "GET":
            if path in self._queries:
                return _guarded(method, target, functools.partial(self._queries[path], query))
            if path in self._probes:
                return self._probes[path]()
            route = self._gets.get(path)
            if route is None:
                return Reply.text(404, f"not found: try {', '.join(sorted([*self._gets, *self._queries]))}")
            return _guarded(method, target, route)
        if method == "DELETE":
            delete = self._deletes.get(path)
            if delete is None:
                return Reply.text(
                    404, f"not found: DELETE goes to {', '.join(sorted(self._deletes)) or 'nothing here'}"
                )
            return _guarded(method, target, functools.partial(delete, query))  # a body is not read
        if method == "POST":
            post = self._posts.get(path)
            if post is None:
                return Reply.text(404, f"not found: POST goes to {', '.join(sorted(self._posts)) or 'nothing here'}")
            try:
                length = int(headers.get("Content-Length", ""))
            except ValueError:
                return Reply.text(411, "a POST needs a Content-Length header")
            if not 0 <= length <= MAX_BODY_BYTES:
                return Reply.text(413, f"the body may be at most {MAX_BODY_BYTES} bytes, got {length}")
            try:
                body = await reader.readexactly(length)
            except (asyncio.IncompleteReadError, ConnectionError):
                return None
            return _guarded(method, target, functools.partial(post, body))
        return Reply.text(501, f"unsupported method {method}: GET, POST and DELETE are")


async def _discard(reader: asyncio.StreamReader) -> None:
    while await reader.read(MAX_HEAD_BYTES):
        pass


_HEAD_TOO_LARGE = Reply.text(431, f"the request line and headers may be at most {MAX_HEAD_BYTES} bytes")


def _guarded(method: str, target: str, route: Callable[[], Reply]) -> Callable[[], Reply]:
    def run() -> Reply:
        try:
            return route()
        except Exception as exc:  # a bug in one route must not take the probes down
            logging.getLogger(LOGGER_NAME).exception("%s %s failed", method, target)
            return Reply.text(500, f"{method} {target} failed: {exc}")

    return run


def _encode(reply: Reply) -> bytes:
    try:
        phrase = HTTPStatus(reply.status).phrase
    except ValueError:
        phrase = ""
    head = (
        f"HTTP/1.0 {reply.status} {phrase}\r\n"
        f"Date: {email.utils.formatdate(usegmt=True)}\r\n"
        f"Content-Type: {reply.content_type}\r\n"
        f"Content-Length: {len(reply.body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + reply.body
