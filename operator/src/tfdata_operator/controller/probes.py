"""What the operator reads from the server pods over HTTP: the dispatcher's signals and snapshots, a server's readiness.

``fetch`` reads one ``signals.ServiceSignals`` from a dispatcher pod's ``/v1/signals``: a
short timeout, a bounded body, and never an exception (a dispatcher that is down, restarting
or of another version is an ordinary moment, described in words). ``fetch_snapshots`` reads its
``/v1/snapshots`` (``snapshots.SnapshotsReport``) the same way. ``read_readiness`` reads
what a server's ``/readyz`` says about itself, for the status's explanation; ``read_server_info``
what it runs (``/serverinfo``), for ``status.server``.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TypeVar

from tfdata_operator.controller import metrics
from tfdata_operator.wire import serverinfo
from tfdata_operator.wire.serverinfo import ServerInfo
from tfdata_operator.wire.signals import ServiceSignals
from tfdata_operator.wire.snapshots import SnapshotsReport

# The dispatcher answers from memory (its poll of the workers runs apart): anything slower is a
# dispatcher in trouble, and the reconcile thread must not wait on it.
TIMEOUT_SECONDS = 2.0
# A ServiceSignals document is well under 1 KiB, plus one name per unreachable worker.
MAX_BYTES = 256 * 1024
# Cluster-local addresses: never through an HTTP(S)_PROXY from the operator's environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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
    """A bounded body, or why there is none."""
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            body: bytes = response.read(max_bytes + 1)
            # A bounded read returns what came before the connection dropped, without an error:
            # what the Content-Length still promised says so.
            missing = getattr(response, "length", None)
    except urllib.error.HTTPError as exc:
        return f"GET {url} answered {exc.code} {exc.reason}"
    except urllib.error.URLError as exc:
        return f"GET {url} failed: {exc.reason}"
    except (OSError, http.client.HTTPException) as exc:  # timeouts, resets, a garbled answer
        return f"GET {url} failed: {type(exc).__name__}: {exc or 'no detail'}"
    if len(body) > max_bytes:
        return f"GET {url} answered more than {max_bytes} bytes"
    if missing:
        return f"GET {url} failed: the answer ended {missing} bytes short of its Content-Length"
    return body


# A readiness detail is one line; more is not a detail.
MAX_READINESS_BYTES = 4096


def read_readiness(url: str, timeout: float = TIMEOUT_SECONDS) -> str | None:
    """What a server's ``/readyz`` says about itself (its 503 body: "not ok: running: ...; 2 of 3 workers
    registered: waiting for ..."), or None when it could not be asked (not there, not answering)."""
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            body = response.read(MAX_READINESS_BYTES)
    except urllib.error.HTTPError as exc:
        body = exc.read(MAX_READINESS_BYTES)
        exc.close()
    except (OSError, http.client.HTTPException):
        return None
    text = body.decode("utf-8", "replace").strip()
    return text or None


# A ServerInfo lists every op its TensorFlow has registered: some thousands of names.
MAX_SERVER_INFO_BYTES = 1024 * 1024


def read_server_info(url: str, timeout: float = TIMEOUT_SECONDS) -> ServerInfo | None:
    """A server's ``/serverinfo`` (its TensorFlow, GraphDef versions and ops), or None when it
    could not be read (not there yet, of an operator version without it, not answering)."""
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            body = response.read(MAX_SERVER_INFO_BYTES + 1)
    except (OSError, http.client.HTTPException):  # HTTPError and URLError are OSErrors
        return None
    if len(body) > MAX_SERVER_INFO_BYTES:
        return None
    try:
        return serverinfo.from_json(body)
    except serverinfo.ServerInfoError:
        return None


# A deletion lists what it removed: one line per stream and chunk at most.
MAX_DELETION_BYTES = 4 * 1024 * 1024
# Deleting a snapshot's chunks from object storage can take a while.
DELETION_TIMEOUT_SECONDS = 120.0


def delete_snapshot(url: str, timeout: float = DELETION_TIMEOUT_SECONDS) -> str | None:
    """``DELETE`` of one snapshot's data on the dispatcher (``url`` names the path): None once it is
    deleted, else why not (a refusal's own words: a snapshot being written is refused)."""
    request = urllib.request.Request(url, method="DELETE")
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            response.read(MAX_DELETION_BYTES)
    except urllib.error.HTTPError as exc:
        said = exc.read(MAX_READINESS_BYTES).decode("utf-8", "replace").strip()
        exc.close()
        # The dispatcher's refusal is a sentence (JSON or text); an older server's is an HTML page.
        said = "" if said.startswith("<") else " ".join(said.split())[:1000]
        return f"DELETE {url} answered {exc.code} {exc.reason}" + (f": {said}" if said else "")
    except urllib.error.URLError as exc:
        return f"DELETE {url} failed: {exc.reason}"
    except (OSError, http.client.HTTPException) as exc:
        return f"DELETE {url} failed: {type(exc).__name__}: {exc or 'no detail'}"
    return None
