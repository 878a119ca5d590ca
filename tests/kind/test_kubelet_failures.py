"""What a real kubelet reports when a service's dispatcher cannot run, in the service's conditions.

The integration tier's KUBELET_FAILURES (tests/fixtures/cases.py), whose kubelet states kwok writes there:
here containerd really fails to pull from a registry that does not answer, and the dispatcher
really exits at start (it cannot create its journal in workDir on its read-only root filesystem)
while the kubelet backs off restarting it; and the server program, injected into an image without
TensorFlow, says so as it exits, which the conditions quote as UnsupportedImage.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from podhealth import PodHealth

from fixtures.cases import KUBELET_FAILURES, Unready, manifest, wait_explained
from fixtures.support import Kubectl

TIMEOUT = 180


@pytest.fixture(scope="module")
def applied(kubectl: Kubectl, namespace: str, pod_health: PodHealth) -> Iterator[dict[str, Unready]]:
    """Every case at once (their waits overlap), deleted as soon as the module is done: a dispatcher
    that crashes keeps starting TensorFlow on the shared node."""
    pod_health.expect(
        namespace,
        "crashing-dispatcher-0",
        "test_kubelet_failures.py makes this dispatcher exit at start, over and over",
        restarts=True,
        errors=r"dispatcher failed to start: .*Read-only file system",
    )
    pod_health.expect(
        namespace,
        "no-tensorflow-dispatcher-0",
        "test_kubelet_failures.py runs the server program on an image without TensorFlow",
        restarts=True,
    )
    started = time.monotonic()
    for case in KUBELET_FAILURES:
        kubectl.run("apply", "-n", namespace, "-f", "-", input=manifest(case))
    yield {c.name: c for c in KUBELET_FAILURES}
    print(f"\nkubelet failures: {time.monotonic() - started:.0f}s from apply to every case explained")
    names = [f"tfdata/{c.name}" for c in KUBELET_FAILURES]
    kubectl.run("delete", *names, "-n", namespace, "--wait=true", "--timeout=120s", timeout=130)


@pytest.mark.parametrize("name", [c.name for c in KUBELET_FAILURES])
def test_the_condition_says_what_the_kubelet_says(
    kubectl: Kubectl, namespace: str, applied: dict[str, Unready], name: str
) -> None:
    found = wait_explained(kubectl, namespace, applied[name], TIMEOUT)
    print(f"\n{found['type']}: {found['reason']}: {found['message']}")
