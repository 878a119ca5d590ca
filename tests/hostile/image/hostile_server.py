#!/usr/bin/env python3
"""A tenant's own `tfdata-server` (`serverProgram: FromImage` on an image of theirs) that attacks the
operator instead of serving tf.data: the hostile tier's (tests/hostile) stand-in for such an image.

    tfdata-server dispatcher|worker      # what the operator's pods run; HOSTILE_MODE chooses the attack
    tfdata-server metadata               # the redirects' target on kind (port HOSTILE_PORT): a stand-in
                                         # for the cloud metadata server, answering HOSTILE_SECRET

It listens on the health port of the configuration the operator gives it (TFDATA_SERVER_CONFIG)
and answers a prober (a kubelet's `kube-probe/...`, the dev node's `Python-urllib/...`) as a
server would: /healthz 200, /readyz 200 on a dispatcher and 503 on a worker, so the operator reads
the dispatcher's /serverinfo and /v1/signals (TFData autoscaling) and the unready worker's /readyz.
Every other request, the operator's, gets the attack of HOSTILE_MODE:

- drip:     the answer one byte every 1.5 s, for ever;
- redirect: 302 to HOSTILE_TARGET (a server of the test's, whose text must never reach a status);
- huge:     a 60,000-character reason phrase and a 64 MiB body;
- garbled:  terminal escapes and control characters in every text, a /serverinfo whose version is
            10,000 characters of them, a /v1/signals that is not JSON.

Each request of the operator is printed ("operator asked GET /readyz"), so the test sees that the
attack reached it. The metadata server prints every request it gets ("metadata asked GET ..."):
the operator must never be one. Standard library only: it runs on any Python.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE = os.environ.get("HOSTILE_MODE", "drip")
TARGET = os.environ.get("HOSTILE_TARGET", "")
ROLE = sys.argv[1] if len(sys.argv) > 1 else "dispatcher"
PROBERS = ("kube-probe/", "Python-urllib/")
ESCAPES = "\x1b[2J\x1b[31mHOSTILE\x07\x00\r\nReady: True\x1b]0;title\x07\x7f"
DRIP_SECONDS = 1.5


def answer(status: str, body: bytes, content_type: str = "text/plain", length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
    return head.encode("latin-1") + body


def attack(path: str) -> bytes | None:
    """The operator's answer for ``path``; None for the huge body (streamed)."""
    if MODE == "drip":
        return answer("200 OK" if ROLE == "dispatcher" else "503 Service Unavailable", b"x" * 100_000)
    if MODE == "redirect":
        return (f"HTTP/1.1 302 Found\r\nLocation: {TARGET}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").encode()
    if MODE == "garbled":
        if path.startswith("/serverinfo"):
            info = {
                "tensorflow_version": ESCAPES * 400,
                "python_version": ESCAPES * 400,
                "graph_def": {"producer": 1, "min_consumer": 0, "min_producer": 0},
            }
            return answer("200 OK", json.dumps(info).encode(), "application/json")
        if path.startswith("/v1/signals"):
            return answer("200 \x1b[31mOK\x07", b"\xff\xfe{not json" + ESCAPES.encode() * 50, "application/json")
        return b"HTTP/1.1 503 " + ESCAPES.encode() + b"\r\n\r\n\x00\xff" + ESCAPES.encode() * 100
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.headers.get("User-Agent", "").startswith(PROBERS):
            ready = self.path == "/healthz" or (self.path == "/readyz" and ROLE == "dispatcher")
            body = b"ok" if ready else b"not ok: a hostile worker"
            self.wfile.write(answer("200 OK" if ready else "503 Service Unavailable", body))
            return
        print(f"operator asked GET {self.path}", flush=True)
        try:
            reply = attack(self.path)
            if reply is None:  # huge
                self.wfile.write(answer("503 " + "R" * 60_000, b"", length=64 << 20))
                chunk = b"H" * (1 << 20)
                for _ in range(64):
                    self.wfile.write(chunk)
            elif MODE == "drip":
                for i in range(len(reply)):
                    self.wfile.write(reply[i : i + 1])
                    self.wfile.flush()
                    time.sleep(DRIP_SECONDS)
            else:
                self.wfile.write(reply)
        except OSError:
            pass  # the operator hung up, as it should
        self.close_connection = True

    do_DELETE = do_GET


class Metadata(BaseHTTPRequestHandler):
    """The redirects' target: whoever asks gets the secret, and is printed."""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        print(f"metadata asked GET {self.path} from {self.client_address[0]}", flush=True)
        body = json.dumps(os.environ.get("HOSTILE_SECRET", "")).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main() -> None:
    if ROLE == "metadata":
        port, handler = int(os.environ.get("HOSTILE_PORT", "8080")), Metadata
    else:
        port, handler = int(json.loads(os.environ["TFDATA_SERVER_CONFIG"])["health_port"]), Handler
    server = ThreadingHTTPServer(("0.0.0.0", port), handler)
    server.daemon_threads = True
    print(f"hostile {ROLE} ({MODE}) on port {port}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
