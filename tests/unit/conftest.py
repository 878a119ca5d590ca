"""Fixtures for the pure unit tests (their TFDataService bodies and specs come from tests/fixtures/cases.py)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tfdata_operator.controller import probes
from tfdata_operator.render.builders import BuildSettings


@pytest.fixture
def settings() -> BuildSettings:
    return BuildSettings(cluster_domain="cluster.local")


@pytest.fixture(autouse=True)
def no_server_info_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The reconciles here run against pod IPs that are not ours (10.0.0.x): a test that does not
    give the readers its own ``read_server_info`` must not send one there. Calls are recorded and
    fail the test (the read runs in a background thread, where an exception would be lost)."""
    asked: list[str] = []
    monkeypatch.setattr(probes, "read_server_info", lambda url, timeout=0.0: asked.append(url))
    yield asked
    assert not asked, f"a unit test asked {asked} over the network: give the readers a read_server_info"


@pytest.fixture(autouse=True)
def only_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests send nothing past 127.0.0.0/8: the pod IPs their cases name (10.0.0.x) belong to no
    pod of ours, so a connection there is refused here, as an unreachable pod would refuse it, before
    a packet leaves (readers a test does not replace then take their "cannot read" path)."""
    connect = socket.socket.connect

    def loopback_only(sock: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else None
        if host is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                loopback = ipaddress.ip_address(host.split("%")[0]).is_loopback
            except ValueError:
                loopback = host == "localhost"
            if not loopback:
                raise ConnectionRefusedError(f"unit tests connect only to 127.0.0.0/8, not {host}")
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", loopback_only)
