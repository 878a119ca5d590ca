"""``SNAPSHOTS_PATH`` on the supervisor's health port: forwarded to the TensorFlow process, which
reads and deletes snapshots (``snapshots``) on a port of 127.0.0.1 it reports in its status. The
supervisor never imports TensorFlow, and never reads a snapshot's files itself."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable

from tfdata_operator.server.probestate import ProbeState, Reply
from tfdata_operator.wire import snapshots

# The supervisor waits this long for the TensorFlow process to answer (a first read of a large
# snapshot on a remote file system stats every chunk).
PROXY_TIMEOUT_SECONDS = 30.0
# A DELETE answers once it has checked the path and written the tombstone's markers (a read of the
# journal, a listing, two small files); the files are removed in the background.
DELETE_TIMEOUT_SECONDS = 120.0


def proxy_route(
    state: ProbeState, timeout: float = PROXY_TIMEOUT_SECONDS, method: str = "GET"
) -> Callable[[str], Reply]:
    """``SNAPSHOTS_PATH`` on the supervisor's health port (``method``): asks the TensorFlow process."""

    def answer(query: str) -> Reply:
        port = state.snapshots_port()
        if port is None:
            return Reply.text(503, f"not known yet: {state.phase}: {state.detail}")
        url = f"http://127.0.0.1:{port}{snapshots.SNAPSHOTS_PATH}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=timeout) as response:
                return Reply(response.status, response.read(), response.headers.get_content_type())
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, exc.read(), exc.headers.get_content_type())
        except (urllib.error.URLError, OSError) as exc:
            return Reply.text(503, f"the TensorFlow process did not answer: {exc}")

    return answer
