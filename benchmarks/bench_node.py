"""`make bench`, the node part: what a user waits for, on a dev cluster WITH its node (pods run
`tfdata-server` with real TensorFlow as processes), in one run:

- apply -> Ready for a 4-worker DYNAMIC TFDataService (median of --runs, each a fresh service);
- idle static rescales of a FILE service: 2->3 (the operator-at-scale figure), 2->4 and 4->2 (the
  rescale figures), each `kubectl scale` -> Ready with the new worker list, median of --runs, next
  to the workers' heartbeat interval;
- client throughput through the operator-deployed 4-worker DYNAMIC service vs the same TensorFlow
  servers started by hand (one dispatcher and 4 workers in one process, in the client's own network
  namespace), reading the same TFRecord files with the same CPU-bound map: runs alternate between
  the two (A B A B ...) so that the machine's noise falls on both, and the ratio is of the medians.

  Like with like, on a machine others share (the figures of the runs that asked why the operator's
  side fell from run to run, 623 -> 529 -> 389 elements/s beside 786 -> 789 by hand, are in the
  commit that made these two changes):
  - the servers started by hand run in a CPU cgroup beside the pods', weighted by the pods' CPU
    requests (``like_the_pods``). Outside it, their threads each weighed as much as the whole node
    (the kernel weighs the node's cgroup, all pods together, as one task), so whatever else the
    machine ran (the client too) slowed the operator's side far more than theirs;
  - a run's figure is its rate from the first element to the last. The whole read's time also holds
    TensorFlow's start of the job and its end, which the client learns from the dispatcher on a
    once-a-second poll, so it moves in steps of about a second (a 4,000-element read of 5 to 10 s
    showed 786, 630, 560, 490 or 389 elements/s and little between); it is kept as ``read_seconds``,
    beside how busy the machine was with other work just before each read.

Prints a table and writes .local/bench/node-last.json (the previous run's kept as node-previous.json,
and printed beside). Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import OUT, now_rfc3339, report

from tfdata_operator.render import builders

import devcluster
from devcluster import node as nodeagent

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = ROOT / "tests" / "e2e" / "clients"
BY_HAND = ROOT / "tests" / "server" / "client_cluster.py"  # a dispatcher and its workers in one process
NAMESPACE = "bench-node"
FILES, RECORDS = 8, 500


class Bench:
    def __init__(self, cluster: devcluster.Cluster, timeout: float) -> None:
        self.cluster, self.timeout = cluster, timeout
        self.env = cluster.env()
        self.kubectl_bin = str(cluster.bin_dir / "kubectl")

    def kubectl(self, *argv: str, input: str | None = None) -> str:
        result = subprocess.run([self.kubectl_bin, *argv], env=self.env, input=input, text=True, capture_output=True)
        if result.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
        return result.stdout

    def apply(self, name: str, spec: dict[str, Any]) -> None:
        body = {"apiVersion": "tfdata.dev/v1alpha1", "kind": "TFDataService",
                "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}  # fmt: skip
        self.kubectl("apply", "-f", "-", input=json.dumps(body))

    def status(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.kubectl("get", "tfdata", name, "-n", NAMESPACE, "-o", "json")).get("status") or {})

    def wait_ready(self, name: str, workers: int, static: bool) -> float:
        """When the service is Ready with ``workers`` ready workers (and, if static, that many listed)."""
        started = time.monotonic()
        st: dict[str, Any] = {}
        while time.monotonic() - started < self.timeout:
            st = self.status(name)
            ready = next((c for c in st.get("conditions") or [] if c["type"] == "Ready"), {})
            listed = len(st.get("workerAddresses") or []) == workers or not static
            if (
                listed
                and (st.get("workers") or {}).get("summary") == f"{workers}/{workers}"
                and ready.get("status") == "True"
            ):
                return time.monotonic()
            time.sleep(0.2)
        raise SystemExit(f"{name} not Ready with {workers} workers after {self.timeout:.0f}s; status: {json.dumps(st)}")

    def delete(self, name: str) -> None:
        self.kubectl("delete", "tfdata", name, "-n", NAMESPACE, "--wait=true", "--timeout=120s")
        deadline = time.monotonic() + 120
        selector = f"app.kubernetes.io/instance={name}"
        while json.loads(self.kubectl("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "json"))["items"]:
            if time.monotonic() > deadline:
                raise SystemExit(f"the pods of {name} did not stop within 120 s")
            time.sleep(0.5)

    def apply_to_ready(self, runs: int) -> list[float]:
        times = []
        for run in range(runs):
            asked = time.monotonic()
            self.apply("ready", {"shardingPolicy": "DYNAMIC", "workers": {"replicas": 4}})
            times.append(round(self.wait_ready("ready", 4, static=False) - asked, 1))
            print(f"  apply -> Ready, 4 workers, run {run + 1}: {times[-1]} s", flush=True)
            self.delete("ready")
        return times

    def rescales(self, runs: int) -> dict[str, list[float]]:
        self.apply("rescale", {"shardingPolicy": "FILE", "workers": {"replicas": 2}})
        self.wait_ready("rescale", 2, static=True)
        times: dict[str, list[float]] = {"2→3": [], "2→4": [], "4→2": []}
        for run in range(runs):
            for change, end in (("2→3", 3), ("3→2", 2), ("2→4", 4), ("4→2", 2)):
                time.sleep(3)  # a settled, idle service
                asked = time.monotonic()
                self.kubectl("scale", "tfdata/rescale", f"--replicas={end}", "-n", NAMESPACE)
                took = round(self.wait_ready("rescale", end, static=True) - asked, 1)
                if change in times:
                    times[change].append(took)
                    print(f"  rescale {change}, run {run + 1}: {took} s", flush=True)
        sts = json.loads(self.kubectl("get", "statefulset", "rescale-worker", "-n", NAMESPACE, "-o", "json"))
        self.heartbeat_ms = (builders.read_config(sts) or {}).get("heartbeat_interval_ms")
        self.delete("rescale")
        return times

    def read(self, prefix: list[str], address: str, data: Path, burn: int) -> dict[str, float]:
        """One full read of the files through ``address``: its elements per second from the first
        element to the last, the seconds of the whole read, and how busy the machine was with other
        work in the 3 s before it (the servers idle, no client yet)."""
        argv = [*prefix, "python", str(CLIENTS / "read_dataset.py"), "--service", address, "--files",
                str(data / "*.tfrecord"), "--mode", "DYNAMIC", "--timeout", "600", f"--burn={burn}"]  # fmt: skip
        busy_before = machine_cpu()
        time.sleep(3)
        busy_after = machine_cpu()
        result = subprocess.run(argv, env=nodeagent.client_env(), capture_output=True, text=True, check=False)
        summary = next((line for line in result.stdout.splitlines() if line.startswith("summary ")), None)
        if result.returncode != 0 or summary is None:
            raise SystemExit(f"the client failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
        figures = json.loads(summary.split(" ", 1)[1])
        if figures["elements"] != FILES * RECORDS:
            raise SystemExit(f"the client read {figures['elements']} elements, not {FILES * RECORDS}")
        streaming = float(figures["last_element"]) - float(figures["first_element"])
        return {
            "elements_per_second": round((figures["elements"] - 1) / streaming, 1),
            "read_seconds": round(float(figures["seconds"]), 2),
            "machine_busy_before": round((busy_after[0] - busy_before[0]) / max(1, busy_after[1] - busy_before[1]), 2),
        }

    def throughput(self, runs: int, data: Path, burn: int) -> dict[str, Any]:
        self.apply("throughput", {"shardingPolicy": "DYNAMIC", "workers": {"replicas": 4}})
        self.wait_ready("throughput", 4, static=False)
        operator_address = self.status("throughput")["dispatcherAddress"]
        pods = json.loads(self.kubectl("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/instance=throughput",
                                       "-o", "json"))["items"]  # fmt: skip
        ports = [str(p) for p in netns_ports(4)]
        arms = ("operator", "by hand")
        figures: dict[str, dict[str, list[float]]] = {
            name: {arm: [] for arm in arms} for name in ("elements_per_second", "read_seconds", "machine_busy_before")
        }
        state_dir = self.cluster.state_dir or self.cluster.kubeconfig.parent
        with nodeagent.client_netns(state_dir, NAMESPACE) as prefix:
            servers = subprocess.Popen(
                [*prefix, sys.executable, str(BY_HAND), "DYNAMIC", "4", *ports],
                env=nodeagent.client_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
            with like_the_pods(state_dir, pods, servers) as placed:
                print(f"  the servers started by hand run {placed}", flush=True)
                assert servers.stdout is not None
                by_hand_address = servers.stdout.readline().strip()
                if not by_hand_address:
                    raise SystemExit("the hand-started servers did not print their address")
                for run in range(runs):
                    for which, address in zip(arms, (operator_address, by_hand_address), strict=True):
                        read = self.read(prefix, address, data, burn)
                        for name, value in read.items():
                            figures[name][which].append(value)
                        busy = f"machine {read['machine_busy_before']:.0%} busy before it"
                        print(
                            f"  throughput, {which}, run {run + 1}: {read['elements_per_second']} elements/s "
                            f"(read in {read['read_seconds']} s; {busy})",
                            flush=True,
                        )
        self.delete("throughput")
        rates = figures["elements_per_second"]
        operator, by_hand = statistics.median(rates["operator"]), statistics.median(rates["by hand"])
        return {**figures, "ratio_operator_to_by_hand": round(operator / by_hand, 2)}


def machine_cpu() -> tuple[int, int]:
    """The machine's busy and total CPU time so far (/proc/stat, in ticks): whatever else it runs
    slows both sides of the comparison, and the table shows how much there was."""
    ticks = [int(field) for field in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle and iowait
    return sum(ticks) - idle, sum(ticks)


@contextlib.contextmanager
def like_the_pods(state_dir: Path, pods: list[dict[str, Any]], servers: subprocess.Popen[str]) -> Iterator[str]:
    """Runs ``servers`` (started by hand) where the node runs the service's pods, and stops them:
    in a CPU cgroup under the node's, weighted by the pods' CPU requests together.

    The node puts every pod's containers in cgroups under one of its own, which the kernel weighs
    against everything else on the machine as one task (cgroup v1 cpu.shares, 1024); a process
    outside it is weighed thread by thread. Left outside, the hand-started servers' threads would
    outweigh the pods whenever anything else (the control plane, the client, other jobs) wants the
    CPU, and the comparison would measure the machine's other load instead of the operator.
    """
    node = nodeagent.Layout(state_dir).cpu_cgroup
    if not node.is_dir():
        try:
            yield "outside any cgroup (the node enforces no CPU: neither do the pods)"
        finally:
            servers.kill()
            servers.wait()
        return
    requested = sum(
        nodeagent.millicores(c.get("resources", {}).get("requests", {}).get("cpu")) or 0
        for pod in pods
        for c in pod["spec"]["containers"]
    )
    cgroup = node / "bench-by-hand"
    cgroup.mkdir(exist_ok=True)
    settings = nodeagent.cfs_settings({"requests": {"cpu": f"{requested}m"}} if requested else {})
    for file, value in settings.items():
        (cgroup / file).write_text(str(value))
    try:
        (cgroup / "cgroup.procs").write_text(str(servers.pid))  # every thread of the process
        yield f"in {cgroup} beside the pods (cpu.shares {settings.get('cpu.shares', 1024)}: {requested}m requested)"
    finally:
        servers.kill()
        servers.wait()
        os.rmdir(cgroup)  # empty once its process is gone


def netns_ports(count: int) -> list[int]:
    """Ports for the hand-started servers: they listen inside their own network namespace, where all are free."""
    return [25000 + i for i in range(count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each figure (medians are reported)")
    parser.add_argument("--burn", type=int, default=4, help="256x256 matmuls per element in the workers")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for Ready")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    state = OUT / f"node-cluster-{os.getpid()}"
    cluster = devcluster.up(state, devcluster.COMPONENTS_WITH_NODE)
    operator = None
    data = ROOT / ".local" / "bench" / "node-data"
    try:
        bench = Bench(cluster, args.timeout)
        devcluster.install_crds(cluster)
        bench.kubectl("create", "namespace", NAMESPACE)
        if not (data / f"part-{FILES - 1:03d}.tfrecord").exists():
            subprocess.run([sys.executable, str(CLIENTS / "make_dataset.py"), str(data), f"--files={FILES}",
                            f"--records={RECORDS}"], check=True, capture_output=True)  # fmt: skip
        log = open(state / "logs" / "operator.log", "wb")  # noqa: SIM115 - the child keeps it
        operator = subprocess.Popen(
            [str(Path(sys.executable).with_name("tfdata-operator")), "run", "--log-format=plain",
             f"--namespace={NAMESPACE}"],
            env={**bench.env, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        results: dict[str, Any] = {"when": now_rfc3339(), "cpus": os.cpu_count(), "runs": args.runs}
        print("apply -> Ready ...", flush=True)
        ready = bench.apply_to_ready(args.runs)
        results["apply_to_ready_4_workers_s"] = {"median": statistics.median(ready), "runs": ready}
        print("idle static rescales ...", flush=True)
        rescales = bench.rescales(args.runs)
        results["static_rescale_s"] = {
            change: {"median": statistics.median(values), "runs": values} for change, values in rescales.items()
        }
        results["static_rescale_s"]["worker heartbeat ms"] = bench.heartbeat_ms
        print("throughput, operator-deployed vs by hand ...", flush=True)
        results["throughput"] = {"burn": args.burn, **bench.throughput(args.runs, data, args.burn)}
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(30)
        devcluster.down(state)
    report(results, "node-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
