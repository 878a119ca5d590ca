"""Commands outside the cluster that reach its pods and Services by name: a network
namespace of their own on the bridge, with a hosts file the agent keeps current."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

from .containers import default_venv_bin
from .hosts import HOSTS_HEADER, write_hosts
from .network import IP, Layout, Network, kill_netns


@contextlib.contextmanager
def client_netns(state_dir: Path, namespace: str = "default", timeout: float = 15) -> Iterator[list[str]]:
    """A fresh network namespace on the cluster's bridge, whose /etc/hosts (kept current by
    the agent) resolves the cluster's Services and pod names; yields the command prefix
    (`ip netns exec NAME`) and removes the namespace afterwards, with whatever still runs in it.
    Short names (`<svc>`) resolve in `namespace`."""
    layout = Layout(state_dir)
    network = Network(layout)
    if network.subnet is None or not Path(f"/run/netns/{layout.bridge_ns}").exists():
        raise RuntimeError(f"no node agent runs for {layout.state_dir} (start the cluster with the node)")
    key = f"client/{secrets.token_hex(4)}"
    ip = network.allocate(key)
    netns = layout.netns(ip)
    registration = layout.clients_dir / netns
    try:
        network.add(netns, ip)
        write_hosts(netns, "127.0.0.1\tlocalhost\n")
        layout.clients_dir.mkdir(parents=True, exist_ok=True)
        registration.write_text(json.dumps({"namespace": namespace}) + "\n")
        deadline = time.monotonic() + timeout
        while not Path(f"/etc/netns/{netns}/hosts").read_text().startswith(HOSTS_HEADER):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the node agent did not write the hosts file of {netns} within {timeout:.0f}s")
            time.sleep(0.1)
        yield [IP, "netns", "exec", netns]
    finally:
        registration.unlink(missing_ok=True)
        kill_netns(netns)
        network.release(key)


def client_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a client command: the project's venv first on PATH, and no proxy (gRPC
    would send the cluster's traffic to it)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if "proxy" not in k.lower()}
    env["PATH"] = f"{default_venv_bin()}:{env.get('PATH', '')}"
    return env
