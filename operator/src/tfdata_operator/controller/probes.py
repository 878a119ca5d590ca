"""What the operator reads from the server pods over HTTP: the dispatcher's signals and snapshots, a server's readiness.

``fetch`` reads one ``signals.ServiceSignals`` from a dispatcher pod's ``/v1/signals``: a
short timeout, a bounded body, and never an exception (a dispatcher that is down, restarting
or of another version is an ordinary moment, described in words). ``fetch_snapshots`` reads its
``/v1/snapshots`` (``snapshots.SnapshotsReport``) the same way. ``read_readiness`` reads
what a server's ``/readyz`` says about itself, for the status's explanation; ``read_server_info``
what it runs (``/serverinfo``), for ``status.server``.

Every read goes through ``request``: the pods are the tenants', so a read is bounded in time as a
whole (``TIMEOUT_SECONDS`` for connect, headers and body together, however slowly a pod sends) and
in size, and a redirect is never followed. A pod that drips its answer costs its own service's
reconcile at most that long per read, never a reconcile thread for longer.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tfdata_operator.controller import metrics
from tfdata_operator.wire import serverinfo
from tfdata_operator.wire.serverinfo import ServerInfo
from tfdata_operator.wire.signals import ServiceSignals
from tfdata_operator.wire.snapshots import SnapshotDeletion, SnapshotsError, SnapshotsReport

# The dispatcher answers from memory (its poll of the workers runs apart): anything slower is a
# dispatcher in trouble, and the reconcile thread must not wait on it.
TIMEOUT_SECONDS = 2.0
# A ServiceSignals document is well under 1 KiB, plus one name per unreachable worker.
MAX_BYTES = 256 * 1024


@dataclass(frozen=True)
class Answer:
    """What a pod answered: its status line and at most the bound asked for of its body."""

    status: int
    reason: str
    content_type: str
    body: bytes
    # What the Content-Length still promised when the body ended (0: all of it, or no length).
    missing: int


def _cut(connection: http.client.HTTPConnection, expired: threading.Event) -> None:
    expired.set()
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked on a pod that drips


def request(url: str, timeout: float, max_bytes: int, method: str = "GET") -> Answer | str:
    """One HTTP exchange with a pod, or why there is none (never an exception).

    The operator reads pods it does not trust, so ``timeout`` bounds the whole exchange (connect,
    status line, headers and body together: a pod that sends a byte at a time is cut off at the
    deadline, not at each read's); the body is read up to ``max_bytes + 1`` bytes; a redirect is
    an answer like any other, never followed (a pod must not send the operator elsewhere); and no
    HTTP(S)_PROXY of the operator's environment is used (the addresses are cluster-local).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return f"{method} {url}: not an http:// address"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    expired = threading.Event()
    timer = threading.Timer(timeout, _cut, (connection, expired))
    timer.daemon = True
    timer.start()
    try:
        connection.connect()
        if expired.is_set():
            raise TimeoutError("timed out")
        connection.request(method, target, headers={"Connection": "close"})
        response = connection.getresponse()
        body = response.read(max_bytes + 1)
        if expired.is_set():  # the read was cut short by the deadline, not ended by the pod
            raise TimeoutError("timed out")
        return Answer(response.status, response.reason, response.headers.get_content_type(), body, response.length or 0)
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, a garbled answer
        if expired.is_set():
            return f"{method} {url} failed: no whole answer within {timeout:g}s (timed out)"
        return f"{method} {url} failed: {type(exc).__name__}: {exc or 'no detail'}"
    finally:
        timer.cancel()
        connection.close()


def fetch(url: str, timeout: float = TIMEOUT_SECONDS) -> ServiceSignals | str:
    """The dispatcher's signals, or why they could not be read; counted (``metrics.SIGNAL_READS``)."""
    fetched = _document(url, timeout, MAX_BYTES, ServiceSignals.from_json)
    metrics.SIGNAL_READS.labels("false" if isinstance(fetched, str) else "true").inc()
    return fetched


# The dispatcher reads the snapshots' files (through tf.io.gfile, gs:// included) when its last
# reading is older than 5 s: slower than its signals, never this slow.
SNAPSHOTS_TIMEOUT_SECONDS = 5.0
# One entry is well under 1 KiB plus its path and error text (each bounded by the dispatcher).
MAX_SNAPSHOTS_BYTES = 4 * 1024 * 1024


def fetch_snapshots(url: str, timeout: float = SNAPSHOTS_TIMEOUT_SECONDS) -> SnapshotsReport | str:
    """The dispatcher's ``/v1/snapshots``, or why it could not be read; counted (``metrics.SNAPSHOT_READS``)."""
    fetched = _document(url, timeout, MAX_SNAPSHOTS_BYTES, SnapshotsReport.from_json)
    metrics.SNAPSHOT_READS.labels("false" if isinstance(fetched, str) else "true").inc()
    return fetched


T = TypeVar("T")


def _document(url: str, timeout: float, max_bytes: int, parse: Callable[[bytes], T]) -> T | str:
    """One JSON document parsed (its ``parse`` raises a ValueError saying what is wrong), or why there is none."""
    body = _get(url, timeout, max_bytes)
    if isinstance(body, str):
        return body
    try:
        return parse(body)
    except ValueError as exc:  # SignalsError, SnapshotsError
        return f"GET {url}: {exc}"


def _get(url: str, timeout: float, max_bytes: int) -> bytes | str:
    """A bounded body of a 2xx answer, or why there is none."""
    answer = request(url, timeout, max_bytes)
    if isinstance(answer, str):
        return answer
    if not 200 <= answer.status < 300:
        return f"GET {url} answered {answer.status} {_words(answer.reason, 100)}"
    if len(answer.body) > max_bytes:
        return f"GET {url} answered more than {max_bytes} bytes"
    if answer.missing:
        return f"GET {url} failed: the answer ended {answer.missing} bytes short of its Content-Length"
    return answer.body


def _words(raw: str | bytes, limit: int) -> str:
    """A pod's text as one line of at most ``limit`` characters."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return " ".join(text.split())[:limit]


# A readiness detail is one line; more is not a detail.
MAX_READINESS_BYTES = 4096


def read_readiness(url: str, timeout: float = TIMEOUT_SECONDS) -> str | None:
    """What a server's ``/readyz`` says about itself (its 503 body: "not ok: running: ...; 2 of 3 workers
    registered: waiting for ..."), or None when it could not be asked (not there, not answering, or
    answering with a redirect, which is never followed)."""
    answer = request(url, timeout, MAX_READINESS_BYTES)
    if isinstance(answer, str) or 300 <= answer.status < 400:
        return None
    text = answer.body[:MAX_READINESS_BYTES].decode("utf-8", "replace").strip()
    return text or None


# A ServerInfo lists every op its TensorFlow has registered: some thousands of names.
MAX_SERVER_INFO_BYTES = 1024 * 1024


def read_server_info(url: str, timeout: float = TIMEOUT_SECONDS) -> ServerInfo | None:
    """A server's ``/serverinfo`` (its TensorFlow, GraphDef versions and ops), or None when it
    could not be read (not there yet, of an operator version without it, not answering)."""
    body = _get(url, timeout, MAX_SERVER_INFO_BYTES)
    if isinstance(body, str):
        return None
    try:
        return serverinfo.from_json(body)
    except serverinfo.ServerInfoError:
        return None


# A deletion lists what it removed: one line per stream and chunk at most.
MAX_DELETION_BYTES = 4 * 1024 * 1024
# A dispatcher answers a DELETE once it has checked the path and written the tombstone's markers, and
# removes the files in the background; one of an earlier version removes them before it answers
# (minutes on object storage), and this bounds that wait.
DELETION_TIMEOUT_SECONDS = 120.0


class UnderWay(str):
    """Why a snapshot's data is not deleted yet, when that is not a failure: the dispatcher removes
    its files in the background (started by this DELETE or an earlier one), or will once it removes
    fewer snapshots at once. Asked again later, it answers 200 once the files are gone."""


def delete_snapshot(url: str, timeout: float = DELETION_TIMEOUT_SECONDS) -> str | None:
    """``DELETE`` of one snapshot's data on the dispatcher (``url`` names the path): None once it is
    deleted (200; any 2xx from a dispatcher of an earlier version, which answers once the files are
    gone), else why not (a refusal's own words: a snapshot being written is refused), an
    ``UnderWay`` (409 or 503 with ``under_way``) while the files are still to be removed."""
    answer = request(url, timeout, MAX_DELETION_BYTES, method="DELETE")
    if isinstance(answer, str):
        return answer
    if 200 <= answer.status < 300:
        return None
    if answer.status in (409, 503) and not answer.missing:
        with contextlib.suppress(SnapshotsError):
            deletion = SnapshotDeletion.from_json(answer.body)
            if deletion.under_way:
                return UnderWay(_words(deletion.detail, 1000))
    said = answer.body[:MAX_READINESS_BYTES].decode("utf-8", "replace").strip()
    # The dispatcher's refusal is a sentence (JSON or text); an older server's is an HTML page.
    said = "" if said.startswith("<") else _words(said, 1000)
    return f"DELETE {url} answered {answer.status} {_words(answer.reason, 100)}" + (f": {said}" if said else "")
