"""The probe endpoints of a dispatcher or worker pod: ``/healthz`` and ``/readyz``.

Served by the supervisor process (standard library only), from the state the TensorFlow
process reports over a pipe, one JSON object per line::

    {"phase": "starting" | "running" | "failed", "ready": true | false, "detail": "..."}

- ``/healthz`` is 200 while the server is starting, running or stopping, and 503 once it
  has failed: a liveness probe restarts a pod whose server cannot start.
- ``/readyz`` is 200 only while the TensorFlow process says it is ready and has said so
  recently; otherwise 503, and the body says why.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STARTING = "starting"
RUNNING = "running"
STOPPING = "stopping"
FAILED = "failed"
_CHILD_PHASES = (STARTING, RUNNING, FAILED)

# A running server reports every second; silence this long means it is wedged.
STALE_AFTER_SECONDS = 10.0


def status_line(phase: str, ready: bool, detail: str) -> bytes:
    """One status report from the TensorFlow process, as written to the pipe."""
    return json.dumps({"phase": phase, "ready": ready, "detail": detail}).encode() + b"\n"


class ProbeState:
    """What the probes answer; thread-safe, fed by the status pipe and the supervisor."""

    def __init__(self, detail: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._phase = STARTING
        self._ready = False
        self._detail = detail
        self._reported_at = clock()

    @property
    def phase(self) -> str:
        with self._lock:
            return self._phase

    @property
    def detail(self) -> str:
        with self._lock:
            return self._detail

    def apply(self, line: bytes | str) -> None:
        """Applies one status line; raises ValueError on a malformed one."""
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError(f"status is not a JSON object: {line!r}")
        phase, ready, detail = message.get("phase"), message.get("ready"), message.get("detail")
        if phase not in _CHILD_PHASES or not isinstance(ready, bool) or not isinstance(detail, str):
            raise ValueError(f"malformed status: {line!r}")
        with self._lock:
            if self._phase in (STOPPING, FAILED):
                return  # final: a late report must not make a stopping server ready again
            self._phase, self._ready, self._detail = phase, ready and phase == RUNNING, detail
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

    def readiness(self) -> tuple[bool, str]:
        with self._lock:
            if self._phase != RUNNING or not self._ready:
                return False, f"{self._phase}: {self._detail}"
            silent = self._clock() - self._reported_at
            if silent > STALE_AFTER_SECONDS:
                return False, f"no report from the TensorFlow server for {silent:.0f}s (last: {self._detail})"
            return True, self._detail


class HealthServer:
    """An HTTP server for the probes, on its own daemon thread."""

    def __init__(self, state: ProbeState, port: int, host: str = "0.0.0.0") -> None:
        probes: dict[str, Callable[[], tuple[bool, str]]] = {
            "/healthz": state.liveness,
            "/readyz": state.readiness,
        }

        class Handler(BaseHTTPRequestHandler):
            timeout = 10  # a client that never finishes its request must not pin a thread

            def do_GET(self) -> None:
                probe = probes.get(self.path.split("?", 1)[0])
                if probe is None:
                    self._reply(404, "not found: try /healthz or /readyz")
                    return
                ok, detail = probe()
                self._reply(200 if ok else 503, detail if ok else f"not ok: {detail}")

            def _reply(self, code: int, text: str) -> None:
                body = (text + "\n").encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

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
