"""Reads a dispatcher pod's ``/v1/signals`` for the hold decision (``hold.py``).

First straight from the pod's IP (from the watched pod's status: no request to the API
server), which works where the operator can route to pods: in the cluster, and on the
dev cluster, whose node puts the host on the pods' bridge. Where it cannot (an operator
outside a kind cluster), through the API server's proxy to the same pod and port. The
health port is open to every peer by the service's NetworkPolicy.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from .kube import describe_api_error
from .signals import SIGNALS_PATH, ServiceSignals, SignalsError

# The decision waits on this: a dispatcher that does not answer within it counts as "reading".
TIMEOUT_SECONDS = 2.0
_MAX_BYTES = 1 << 20


class SignalReader(Protocol):
    """Reads the signals of the dispatcher ``pod`` on its health ``port``; raises ``SignalsError`` when it cannot."""

    def __call__(self, pod: Mapping[str, Any], port: int) -> ServiceSignals: ...


class Proxy(Protocol):
    def proxy_get(self, namespace: str, pod: str, port: int, path: str) -> bytes: ...


class SignalClient:
    def __init__(self, proxy: Proxy | None = None, timeout: float = TIMEOUT_SECONDS) -> None:
        self.proxy = proxy
        self.timeout = timeout

    def __call__(self, pod: Mapping[str, Any], port: int) -> ServiceSignals:
        meta = pod.get("metadata") or {}
        ip = (pod.get("status") or {}).get("podIP")
        problems = []
        if ip:
            try:
                with urllib.request.urlopen(f"http://{_host(ip)}:{port}{SIGNALS_PATH}", timeout=self.timeout) as r:
                    return ServiceSignals.from_json(r.read(_MAX_BYTES))
            except urllib.error.HTTPError as exc:
                raise SignalsError(f"the dispatcher answered {exc.code} {exc.reason} at {SIGNALS_PATH}") from exc
            except OSError as exc:  # not routable from here, or not answering
                problems.append(f"{ip}:{port}: {getattr(exc, 'reason', exc)}")
        else:
            problems.append("the dispatcher pod has no IP yet")
        if self.proxy is not None:
            try:
                body = self.proxy.proxy_get(meta.get("namespace", ""), meta.get("name", ""), port, SIGNALS_PATH)
                return ServiceSignals.from_json(body)
            except ApiException as exc:
                problems.append(f"through the API server: {describe_api_error(exc)}")
            except OSError as exc:
                problems.append(f"through the API server: {exc}")
        raise SignalsError("could not read the dispatcher's signals: " + "; ".join(problems))


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip
