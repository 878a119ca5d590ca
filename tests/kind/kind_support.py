"""kubectl for the kind tests (tests/kind is on sys.path while they run)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from typing import Any


class KubectlError(AssertionError):
    pass


@dataclass(frozen=True)
class Kubectl:
    """The pinned kubectl against the kind cluster."""

    binary: str
    kubeconfig: str

    def run(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": self.kubeconfig}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        result = subprocess.run(
            [self.binary, *args], input=input, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise KubectlError(
                f"kubectl {' '.join(args)} exited with {result.returncode}\n"
                f"stdout: {result.stdout}\nstderr: {result.stderr}"
            )
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def apply(self, manifest: dict[str, Any]) -> Any:
        return json.loads(self.run("apply", "-f", "-", "-o", "json", input=json.dumps(manifest)).stdout)
