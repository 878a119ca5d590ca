#!/usr/bin/env python3
"""Checks the children the operator renders for every example with kube-score.

Every finding either gets fixed in the builders or is listed, with its reason, in
hack/kube-score-ignored.yaml; anything else fails (``make check-manifests``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
IGNORED = ROOT / "hack" / "kube-score-ignored.yaml"
# The Kubernetes version the project builds and tests against (devcluster/k8s-binaries.sh).
KUBERNETES_VERSION = "v1.34"


def main() -> int:
    kube_score = subprocess.run(
        [str(ROOT / "hack" / "kube-score.sh")], check=True, capture_output=True, text=True
    ).stdout.splitlines()[-1]
    ignored = yaml.safe_load(IGNORED.read_text())
    args = [f"--ignore-test={test}" for test in ignored["ignore-test"]] + list(ignored["flags"])
    render = ROOT / ".venv" / "bin" / "tfdata-operator"
    failed = False
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        rendered = subprocess.run(
            [str(render), "render", "-f", str(example)], check=True, capture_output=True, text=True
        )
        result = subprocess.run(
            [kube_score, "score", "--output-format=ci", f"--kubernetes-version={KUBERNETES_VERSION}",
             "--exit-one-on-warning", *args, "-"],
            input=rendered.stdout, capture_output=True, text=True,
        )  # fmt: skip
        findings = [line for line in result.stdout.splitlines() if line.startswith(("[CRITICAL]", "[WARNING]"))]
        print(f"{example.relative_to(ROOT)}: {len(findings)} findings")
        for line in findings:
            print(f"  {line}")
        if result.returncode != 0 or findings:
            failed = True
            if not findings:
                print(result.stdout + result.stderr)
    if failed:
        print(f"fix the builders, or list the finding with its reason in {IGNORED.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
