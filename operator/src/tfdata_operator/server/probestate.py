"""What the health port's probes answer (``ProbeState``), from the status reports the TensorFlow
process writes to its pipe (``status_line``; the protocol is in ``health``'s docstring), and the
``Reply`` every route of the port answers with. Standard library only: the supervisor, the
TensorFlow process and the routes share it without the HTTP server (``health``)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

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
