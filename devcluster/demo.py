"""`make demo`: from a fresh clone to a tf.data service that a real client reads from.

Brings up the dev cluster with its node (building the Kubernetes binaries the first
time), installs the CRD, starts the operator, applies examples/dynamic.yaml, waits for
Ready, reads a TFRecord dataset through the service with a real TensorFlow client, and
leaves everything running. `make dev-cluster-down` stops it all, the operator included.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import devcluster
from devcluster import node as nodeagent

REPO = Path(__file__).resolve().parents[1]
STATE = devcluster.DEFAULT_STATE_DIR
EXAMPLE = REPO / "examples" / "dynamic.yaml"
NAME = "imagenet"  # the example's name
CLIENT = REPO / "tests" / "e2e" / "clients" / "read_dataset.py"
MAKE_DATASET = REPO / "tests" / "e2e" / "clients" / "make_dataset.py"
DATA = STATE / "demo-data"
FILES, RECORDS = 8, 2000


def say(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def kubectl(cluster: devcluster.Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(cluster.bin_dir / "kubectl"), *args], env=cluster.env(), capture_output=True, text=True, check=False
    )
    if check and result.returncode != 0:
        sys.exit(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
    return result


def start_operator(cluster: devcluster.Cluster) -> None:
    pidfile = STATE / "run" / "tfdata-operator.pid"
    port_file = STATE / "run" / "tfdata-operator.port"
    if pidfile.exists() and port_file.exists() and _alive(int(port_file.read_text())):
        print("the operator is already running")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = STATE / "logs" / "tfdata-operator.log"
    argv = [sys.executable, "-m", "tfdata_operator", "run", f"--liveness=http://127.0.0.1:{port}/healthz"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv, env=cluster.env(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    # In the cluster's run/ directory, so `make dev-cluster-down` stops the operator too.
    pidfile.write_text(json.dumps({"pid": proc.pid, "argv0": argv[0], "started": time.time()}))
    port_file.write_text(str(port))
    deadline = time.monotonic() + 60
    while not _alive(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the operator did not start; its log: {log}")
        time.sleep(0.3)
    print(f"operator running (pid {proc.pid}, log {log})")


def _alive(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def wait_ready(cluster: devcluster.Cluster, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        obj = json.loads(kubectl(cluster, "get", "tfdata", NAME, "-o", "json").stdout)
        conditions = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
        ready = conditions.get("Ready", {})
        line = f"  Ready={ready.get('status', '?')} ({ready.get('reason', 'waiting for the operator')})"
        if line != last:
            print(line, flush=True)
            last = line
        if ready.get("status") == "True":
            return str(obj["status"]["dispatcherAddress"])
        time.sleep(2)
    print(kubectl(cluster, "get", "tfdata,pods", "-o", "wide", check=False).stdout)
    sys.exit(f"{NAME} was not Ready after {timeout:.0f}s; pod logs are in {STATE / 'logs' / 'pods'}")


def main() -> int:
    started = time.monotonic()
    say("Starting the dev cluster: etcd, kube-apiserver, controller-manager, scheduler and a node")
    if devcluster.missing_binaries():
        print("The Kubernetes binaries are not built yet: building them from source now "
              "(about 10-40 minutes on a fresh machine; progress follows).", flush=True)  # fmt: skip
    cluster = devcluster.up(STATE, devcluster.COMPONENTS_WITH_NODE)

    say("Installing the TFDataService CRD")
    try:
        devcluster.install_crds(cluster)
    except devcluster.ClusterError as e:
        sys.exit(str(e))

    say("Starting the operator")
    start_operator(cluster)

    say(f"Applying {EXAMPLE.relative_to(REPO)} and waiting for it to be Ready")
    kubectl(cluster, "apply", "-f", str(EXAMPLE))
    address = wait_ready(cluster)
    print(kubectl(cluster, "get", "tfdata", NAME, "-o", "wide").stdout.rstrip())

    say(f"Writing a TFRecord dataset: {FILES} files x {RECORDS} records in {DATA.relative_to(REPO)}")
    if not (DATA / f"part-{FILES - 1:03d}.tfrecord").exists():
        subprocess.run([sys.executable, str(MAKE_DATASET), str(DATA), f"--files={FILES}", f"--records={RECORDS}"],
                       check=True, capture_output=True)  # fmt: skip

    say(f"Reading it through {address} with a tf.data client (DYNAMIC sharding)")
    with nodeagent.client_netns(STATE) as prefix:
        argv = [*prefix, "python", str(CLIENT), "--service", address, "--files", str(DATA / "*.tfrecord"),
                "--mode", "DYNAMIC", "--timeout", "300"]  # fmt: skip
        result = subprocess.run(argv, env=nodeagent.client_env(), capture_output=True, text=True, check=False)
    elements = [line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("element ")]
    summary = next((line for line in result.stdout.splitlines() if line.startswith("summary ")), None)
    if result.returncode != 0 or summary is None:
        sys.exit(f"the client failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    figures = json.loads(summary.split(" ", 1)[1])
    distinct = len(set(elements))
    print(f"read {figures['elements']} elements ({distinct} distinct of {FILES * RECORDS}) "
          f"in {figures['seconds']:.2f}s: {figures['elements'] / figures['seconds']:.0f} elements/s; "
          f"first: {elements[:3]}, last: {elements[-2:]}")  # fmt: skip

    say(f"Done in {time.monotonic() - started:.0f}s. Everything keeps running; try:")
    env = cluster.env()
    print(f"""
  export KUBECONFIG={env["KUBECONFIG"]}
  export PATH={cluster.bin_dir}:"$PATH"
  kubectl get tfdata -o wide
  kubectl scale tfdata/{NAME} --replicas=3 && kubectl get pods -w
  kubectl describe tfdata {NAME}
  python -m devcluster.node client -- python examples/trainer.py {address} '{DATA}/*.tfrecord'
  make dev-cluster-down        # stops the cluster, its node and the operator

Logs: {STATE / "logs"} (the operator: tfdata-operator.log; pods: pods/<namespace>_<pod>/)""")
    return 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
