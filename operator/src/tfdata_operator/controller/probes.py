"""What the operator reads from the server pods over HTTP: the dispatcher's signals, a server's readiness.

``fetch`` reads one ``signals.ServiceSignals`` from a dispatcher pod's ``/v1/signals``: a
short timeout, a bounded body, and never an exception (a dispatcher that is down, restarting
or of another version is an ordinary moment, described in words). ``read_readiness`` reads
what a server's ``/readyz`` says about itself, for the status's explanation; ``read_server_info``
what it runs (``/serverinfo``), for ``status.server``.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request

from tfdata_operator.controller import metrics
from tfdata_operator.wire import serverinfo
from tfdata_operator.wire.serverinfo import ServerInfo
from tfdata_operator.wire.signals import ServiceSignals, SignalsError

# The dispatcher answers from memory (its poll of the workers runs apart): anything slower is a
# dispatcher in trouble, and the reconcile thread must not wait on it.
TIMEOUT_SECONDS = 2.0
# A ServiceSignals document is well under 1 KiB, plus one name per unreachable worker.
MAX_BYTES = 256 * 1024
# Cluster-local addresses: never through an HTTP(S)_PROXY from the operator's environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str, timeout: float = TIMEOUT_SECONDS) -> ServiceSignals | str:
    """The dispatcher's signals, or why they could not be read; counted (``metrics.SIGNAL_READS``)."""
    fetched = _fetch(url, timeout)
    metrics.SIGNAL_READS.labels("false" if isinstance(fetched, str) else "true").inc()
    return fetched


def _fetch(url: str, timeout: float) -> ServiceSignals | str:
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            body = response.read(MAX_BYTES + 1)
            # A bounded read returns what came before the connection dropped, without an error:
            # what the Content-Length still promised says so.
            missing = getattr(response, "length", None)
    except urllib.error.HTTPError as exc:
        return f"GET {url} answered {exc.code} {exc.reason}"
    except urllib.error.URLError as exc:
        return f"GET {url} failed: {exc.reason}"
    except (OSError, http.client.HTTPException) as exc:  # timeouts, resets, a garbled answer
        return f"GET {url} failed: {type(exc).__name__}: {exc or 'no detail'}"
    if len(body) > MAX_BYTES:
        return f"GET {url} answered more than {MAX_BYTES} bytes: not a signals document"
    if missing:
        return f"GET {url} failed: the answer ended {missing} bytes short of its Content-Length"
    try:
        return ServiceSignals.from_json(body)
    except SignalsError as exc:
        return f"GET {url}: {exc}"


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
