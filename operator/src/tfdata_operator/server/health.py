"""The HTTP port of a dispatcher or worker pod: ``/healthz``, ``/readyz`` and more.

Served by the supervisor process (standard library only), from the state the TensorFlow
process reports over a pipe, one JSON object per line::

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
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tfdata_operator.server import LOGGER_NAME
from tfdata_operator.wire import serverinfo

STARTING = "starting"
RUNNING = "running"
STOPPING = "stopping"
FAILED = "failed"
CANNOT_SERVE = "cannot-serve"
_CHILD_PHASES = (STARTING, RUNNING, FAILED, CANNOT_SERVE)
# Phases no later report changes.
_FINAL = (STOPPING, FAILED, CANNOT_SERVE)

# A running server reports every second; silence this long means it is wedged.
STALE_AFTER_SECONDS = 10.0


# A request body larger than this is refused (413): a client report is a few hundred bytes.
MAX_BODY_BYTES = 64 * 1024


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"

    @classmethod
    def text(cls, status: int, text: str) -> Reply:
        return cls(status, (text + "\n").encode())


GetRoute = Callable[[], Reply]
PostRoute = Callable[[bytes], Reply]
# A GET route that reads the request's query string (without the "?").
QueryRoute = Callable[[str], Reply]


def status_line(
    phase: str,
    ready: bool,
    detail: str,
    stats: Mapping[str, float] | None = None,
    info: serverinfo.ServerInfo | None = None,
    snapshots_port: int | None = None,
) -> bytes:
    """One status report from the TensorFlow process, as written to the pipe."""
    message: dict[str, object] = {"phase": phase, "ready": ready, "detail": detail}
    if stats:
        message["stats"] = dict(stats)
    if info is not None:
        message["info"] = serverinfo.as_dict(info)
    if snapshots_port is not None:
        message["snapshots_port"] = snapshots_port
    return json.dumps(message).encode() + b"\n"


class ProbeState:
    """What the probes answer; thread-safe, fed by the status pipe and the supervisor."""

    def __init__(self, detail: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._phase = STARTING
        self._ready = False
        self._detail = detail
        self._stats: dict[str, float] = {}
        self._info: serverinfo.ServerInfo | None = None
        self._snapshots_port: int | None = None
        self._reported_at = clock()

    @property
    def phase(self) -> str:
        with self._lock:
            return self._phase

    @property
    def detail(self) -> str:
        with self._lock:
            return self._detail

    def stats(self) -> dict[str, float]:
        """The TensorFlow process's last numbers; empty while it is not running or is silent."""
        with self._lock:
            if self._phase != RUNNING or self._clock() - self._reported_at > STALE_AFTER_SECONDS:
                return {}
            return dict(self._stats)

    def info(self) -> serverinfo.ServerInfo | None:
        """What the TensorFlow process measured after its preloads; None until it has."""
        with self._lock:
            return self._info

    def snapshots_port(self) -> int | None:
        """Where the TensorFlow process answers ``/v1/snapshots`` on 127.0.0.1, while it runs."""
        with self._lock:
            return self._snapshots_port if self._phase == RUNNING else None

    def apply(self, line: bytes | str) -> None:
        """Applies one status line; raises ValueError on a malformed one."""
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError(f"status is not a JSON object: {line!r}")
        phase, ready, detail = message.get("phase"), message.get("ready"), message.get("detail")
        stats = message.get("stats", {})
        if phase not in _CHILD_PHASES or not isinstance(ready, bool) or not isinstance(detail, str):
            raise ValueError(f"malformed status: {line!r}")
        if not isinstance(stats, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in stats.values()
        ):
            raise ValueError(f"malformed stats in status: {line!r}")
        info = None
        if "info" in message:
            try:
                info = serverinfo.from_json(json.dumps(message["info"]))
            except serverinfo.ServerInfoError as exc:
                raise ValueError(f"malformed info in status: {exc}") from exc
        port = message.get("snapshots_port")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            raise ValueError(f"malformed snapshots_port in status: {line!r}")
        with self._lock:
            if info is not None:
                self._info = info
            if port is not None:
                self._snapshots_port = port
            if self._phase in _FINAL:
                return  # final: a late report must not make a stopping server ready again
            self._phase, self._ready, self._detail = phase, ready and phase == RUNNING, detail
            self._stats = {str(k): float(v) for k, v in stats.items()}
            self._reported_at = self._clock()

    def stopping(self) -> None:
        with self._lock:
            if self._phase != FAILED:
                self._phase, self._ready, self._detail = STOPPING, False, "shutting down"

    def failed(self, detail: str) -> None:
        with self._lock:
            self._phase, self._ready, self._detail = FAILED, False, detail

    def liveness(self) -> tuple[bool, str]:
        with self._lock:
            if self._phase == FAILED:
                return False, f"failed: {self._detail}"
            return True, f"{self._phase}: {self._detail}"

    def info_reply(self) -> Reply:
        """``serverinfo.INFO_PATH``: the ServerInfo as JSON; 503 while it is not known."""
        info = self.info()
        if info is None:
            return Reply.text(503, f"not known yet: {self.phase}: {self.detail}")
        return Reply(200, serverinfo.to_json(info).encode() + b"\n", "application/json")

    def readiness(self) -> tuple[bool, str]:
        with self._lock:
            if self._phase != RUNNING or not self._ready:
                return False, f"{self._phase}: {self._detail}"
            silent = self._clock() - self._reported_at
            if silent > STALE_AFTER_SECONDS:
                return False, f"no report from the TensorFlow server for {silent:.0f}s (last: {self._detail})"
            return True, self._detail


class HealthServer:
    """An HTTP server for the probes and the routes given, on its own daemon thread."""

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

        gets: dict[str, GetRoute] = {"/healthz": probe(state.liveness), "/readyz": probe(state.readiness)}
        gets.update(get_routes or {})
        posts = dict(post_routes or {})
        queries = dict(query_routes or {})
        deletes = dict(delete_routes or {})

        class Handler(BaseHTTPRequestHandler):
            timeout = 10  # a client that never finishes its request must not pin a thread

            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                if path in queries:
                    self._answer(lambda: queries[path](query))
                    return
                route = gets.get(path)
                if route is None:
                    self._reply(Reply.text(404, f"not found: try {', '.join(sorted([*gets, *queries]))}"))
                    return
                self._answer(route)

            def do_DELETE(self) -> None:
                path, _, query = self.path.partition("?")
                route = deletes.get(path)
                if route is None:
                    self._reply(
                        Reply.text(404, f"not found: DELETE goes to {', '.join(sorted(deletes)) or 'nothing here'}")
                    )
                    return
                if self.headers.get("Content-Length", "0") != "0" or "Transfer-Encoding" in self.headers:
                    self.close_connection = True  # a body is not read: it must not be taken for a request
                self._answer(lambda: route(query))

            def do_POST(self) -> None:
                route = posts.get(self.path.split("?", 1)[0])
                if route is None:
                    self._reply(
                        Reply.text(404, f"not found: POST goes to {', '.join(sorted(posts)) or 'nothing here'}")
                    )
                    return
                try:
                    length = int(self.headers.get("Content-Length", ""))
                except ValueError:
                    self._reply(Reply.text(411, "a POST needs a Content-Length header"))
                    return
                if not 0 <= length <= MAX_BODY_BYTES:
                    self.close_connection = True  # the unread body must not be taken for a request
                    self._reply(Reply.text(413, f"the body may be at most {MAX_BODY_BYTES} bytes, got {length}"))
                    return
                body = self.rfile.read(length)
                self._answer(lambda: route(body))

            def _answer(self, route: Callable[[], Reply]) -> None:
                try:
                    reply = route()
                except Exception as exc:  # a bug in one route must not take the probes down
                    logging.getLogger(LOGGER_NAME).exception("%s %s failed", self.command, self.path)
                    reply = Reply.text(500, f"{self.command} {self.path} failed: {exc}")
                self._reply(reply)

            def _reply(self, reply: Reply) -> None:
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # one line per probe every few seconds would drown the lifecycle log

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.2,), name="health", daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()
