#!/usr/bin/env python3
"""What a shorter worker heartbeat costs the dispatcher: CPU per heartbeat interval, 16 workers.

A benchmark, not a test (issue 14 §1): it prints a table and asserts nothing. For each
interval it starts one real ``tfdata-server dispatcher`` (supervisor + TensorFlow process)
with a static list of N workers on 127.0.0.1, starts the N workers in one helper process
(TensorFlow ``WorkerServer`` objects; their own cost is not what is measured), waits until all
are registered, then reads the dispatcher pod's CPU time (both processes, from /proc) over a
window. Usage::

    .venv/bin/python benchmarks/bench_heartbeat.py [--workers 16] [--window 60] [--intervals 30000,5000,1000,500]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

from tfdata_operator.wire import serverconfig

SERVER_BIN = Path(sys.executable).parent / "tfdata-server"
TICK = os.sysconf("SC_CLK_TCK")

WORKERS_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import tensorflow as tf
    from tensorflow.core.protobuf import service_config_pb2
    spec = json.loads(sys.argv[1])
    servers = []
    for port in spec["ports"]:
        config = service_config_pb2.WorkerConfig(
            port=port, protocol="grpc", dispatcher_address=spec["dispatcher"],
            worker_address=f"127.0.0.1:{port}", heartbeat_interval_ms=spec["heartbeat_ms"])
        servers.append(tf.data.experimental.service.WorkerServer(config))
    print("started", flush=True)
    time.sleep(10**6)
    """
)


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / TICK


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def probe(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return str(response.read().decode())
    except Exception as exc:
        return str(exc)


def measure(heartbeat_ms: int, workers: int, window: float) -> tuple[float, float]:
    """(registration seconds, dispatcher CPU in cores over the window)."""
    dispatcher_port, health_port, *worker_ports = free_ports(workers + 2)
    config = serverconfig.DispatcherServerConfig(
        port=dispatcher_port,
        health_port=health_port,
        worker_addresses=tuple(f"127.0.0.1:{p}" for p in worker_ports),
    )
    env = {**os.environ, serverconfig.CONFIG_ENV: serverconfig.to_json(config)}
    with tempfile.TemporaryFile() as log:
        dispatcher = subprocess.Popen([str(SERVER_BIN), "dispatcher"], env=env, stdout=log, stderr=log)
        spec = json.dumps(
            {
                "ports": worker_ports,
                "dispatcher": f"127.0.0.1:{dispatcher_port}",
                "heartbeat_ms": heartbeat_ms,
            }
        )
        helper = subprocess.Popen(
            [sys.executable, "-c", WORKERS_SCRIPT, spec],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            started = time.monotonic()
            deadline = started + 300
            while "workers registered" not in (seen := probe(health_port)) or not seen.startswith("dispatcher"):
                if time.monotonic() > deadline or dispatcher.poll() is not None:
                    log.seek(0)
                    raise SystemExit(f"dispatcher not ready: {seen}\n{log.read().decode(errors='replace')}")
                time.sleep(0.5)
            while f"{workers} of {workers} workers registered" not in probe(health_port):
                if time.monotonic() > deadline:
                    raise SystemExit(f"workers did not register: {probe(health_port)}")
                time.sleep(0.5)
            registered = time.monotonic() - started
            time.sleep(min(5.0, window / 4))  # let start-up work settle
            pids = [dispatcher.pid, *children(dispatcher.pid)]
            before, t0 = cpu_seconds(pids), time.monotonic()
            time.sleep(window)
            used, elapsed = cpu_seconds(pids) - before, time.monotonic() - t0
            return registered, used / elapsed
        finally:
            helper.kill()
            dispatcher.terminate()
            dispatcher.wait(30)
            helper.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--window", type=float, default=60.0, help="seconds of measurement per interval")
    parser.add_argument("--intervals", default="30000,5000,1000,500", help="heartbeat intervals in ms")
    args = parser.parse_args()
    intervals = [int(v) for v in args.intervals.split(",")]
    print(f"dispatcher CPU with {args.workers} idle workers, {args.window:.0f}s per row, {os.cpu_count()} CPUs")
    print(f"{'heartbeat':>10} {'heartbeats/s':>13} {'CPU (millicores)':>17} {'CPU per heartbeat':>18}")
    for heartbeat_ms in intervals:
        _, cores = measure(heartbeat_ms, args.workers, args.window)
        rate = args.workers * 1000 / heartbeat_ms
        print(
            f"{heartbeat_ms / 1000:>9.1f}s {rate:>13.1f} {cores * 1000:>17.1f} {cores / rate * 1e6:>15.0f} µs",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
