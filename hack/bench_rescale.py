"""Times an idle static rescale on a cluster whose node runs the pods (`make dev-cluster`).

Starts the operator (`python -m tfdata_operator run`, from whatever PYTHONPATH gives, so an
older tree can be timed the same way), creates a FILE TFDataService with 2 workers, and
times `kubectl scale` 2→4 and 4→2, each until the service is Ready with the new worker list
(`status.workerAddresses`, `workers.summary`, `Ready=True`). Prints every run and the median,
next to the workers' heartbeat. A figure, not a test.

    .venv/bin/python hack/bench_rescale.py --kubeconfig .local/kubeconfig --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", default=str(ROOT / ".local" / "kubeconfig"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--namespace", default="bench-rescale")
    parser.add_argument("--crd", default=str(ROOT / "crds"), help="the CRD file or directory to apply")
    parser.add_argument(
        "--heartbeat-ms", type=int, default=None, help="spec.workers.heartbeatIntervalMs (unset: default)"
    )
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    kubectl_bin = Path(subprocess.check_output([str(ROOT / "hack" / "k8s-binaries.sh"), "--print"], text=True).strip())
    env = {**os.environ, "KUBECONFIG": args.kubeconfig}

    def kubectl(*argv: str, input: str | None = None) -> str:
        return subprocess.run(
            [str(kubectl_bin / "kubectl"), *argv], env=env, input=input, text=True, check=True, capture_output=True
        ).stdout

    def status() -> dict[str, Any]:
        return dict(
            json.loads(kubectl("get", "tfdata", "bench", "-n", args.namespace, "-o", "json")).get("status") or {}
        )

    def wait_settled(workers: int) -> float:
        started = time.monotonic()
        while time.monotonic() - started < args.timeout:
            st = status()
            ready = next((c for c in st.get("conditions") or [] if c["type"] == "Ready"), {})
            if (
                len(st.get("workerAddresses") or []) == workers
                and (st.get("workers") or {}).get("summary") == f"{workers}/{workers}"
                and ready.get("status") == "True"
            ):
                return time.monotonic()
            time.sleep(0.2)
        raise SystemExit(f"not Ready with {workers} workers after {args.timeout:.0f}s; status: {json.dumps(st)}")

    kubectl("apply", "-f", args.crd)
    kubectl("create", "namespace", args.namespace)
    log = ROOT / ".local" / "logs" / "bench-rescale-operator.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        operator = subprocess.Popen(
            [sys.executable, "-m", "tfdata_operator", "run", f"--namespace={args.namespace}",
             "--server-image=tfdata-server:bench"],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        workers: dict[str, Any] = {"replicas": 2}
        if args.heartbeat_ms:
            workers["heartbeatIntervalMs"] = args.heartbeat_ms
        body = {
            "apiVersion": "tfdata.dev/v1alpha1",
            "kind": "TFDataService",
            "metadata": {"name": "bench", "namespace": args.namespace},
            "spec": {"shardingPolicy": "FILE", "workers": workers},
        }
        kubectl("apply", "-f", "-", input=json.dumps(body))
        wait_settled(2)
        times: dict[str, list[float]] = {"2→4": [], "4→2": []}
        for run in range(args.runs):
            for change, replicas in (("2→4", 4), ("4→2", 2)):
                time.sleep(3)  # a settled, idle service
                asked = time.monotonic()
                kubectl("scale", "tfdata/bench", f"--replicas={replicas}", "-n", args.namespace)
                took = wait_settled(replicas) - asked
                times[change].append(took)
                print(f"run {run + 1}: {change} {took:.1f} s", flush=True)
        heartbeat = f"{args.heartbeat_ms} ms" if args.heartbeat_ms else "default"
        print(f"\nidle static rescale (FILE), kubectl scale → Ready with the new list; heartbeat {heartbeat}")
        for change, values in times.items():
            print(
                f"  {change}: median {statistics.median(values):.1f} s  (runs: {', '.join(f'{v:.1f}' for v in values)})"
            )
    finally:
        subprocess.run([str(kubectl_bin / "kubectl"), "delete", "namespace", args.namespace, "--wait=true",
                        "--timeout=120s"], env=env, capture_output=True, check=False)  # fmt: skip
        operator.terminate()
        operator.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
