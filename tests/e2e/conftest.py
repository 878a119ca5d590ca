"""Fixtures for end-to-end tests: dispatcher and worker pods that really run `tfdata-server`
with TensorFlow, and real tf.data clients.

By default the session starts its own cluster WITH the dev node (devcluster.node) in
`.local/e2e-cluster-<pid>` and stops it at the end (the state dir, with the components' and
pods' logs, is kept when a test failed). To use an existing cluster instead, name its
kubeconfig, as for tests/integration:

    TFDATA_TEST_KUBECONFIG=.local/kubeconfig pytest tests/e2e

Clients run in a network namespace of the dev node (`nodeagent.client_netns`), which resolves
the cluster's Service and pod names. That works for a cluster started with
`python -m devcluster up --node` (`make dev-cluster`): its state dir is the kubeconfig's
directory. On any other cluster (kind, ...) the pods' network is not reachable from here, and
the tests fail saying so. The shared fixtures (`cluster`, `kubectl`,
`namespace`, `operator`, `node_state_dir`) come from tests/fixtures; the hostile tier
(tests/hostile) uses them on a cluster of the same kind. Each module's server pods are checked
here for tracebacks (`server_logs_without_tracebacks`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import node as nodeagent

TRACEBACK = "Traceback (most recent call last)"
SERVER_CONTAINERS = ("dispatcher.log", "worker.log")


@pytest.fixture(scope="module", autouse=True)
def server_logs_without_tracebacks(node_state_dir: Path) -> Iterator[None]:
    """Every e2e module: no dispatcher or worker pod logged a Python traceback while it ran (tests
    review N5). The dev node appends each container instance's log to one file per pod and
    container, kept after the pod is gone; what each file gained during the module is read after
    the module's namespace is deleted (this fixture is set up before it, so torn down after), with
    what the servers log as they stop. A module that wrote no dispatcher log fails: the check
    would have read nothing."""
    logs = nodeagent.Layout(node_state_dir).logs_dir
    before = {path: path.stat().st_size for path in logs.glob("*/*.log")}
    yield
    read, failures = [], []
    for path in sorted(logs.glob("*/*.log")):
        if path.name not in SERVER_CONTAINERS or path.stat().st_size <= before.get(path, 0):
            continue
        with open(path, "rb") as log:
            log.seek(before.get(path, 0))
            text = log.read().decode(errors="replace")
        read.append(path)
        if TRACEBACK in text:
            failures.append(f"{path}:\n{text[text.index(TRACEBACK) :][:3000]}")
    if not any(p.name == "dispatcher.log" for p in read):
        pytest.fail(f"no dispatcher logged anything under {logs} during this module: the traceback check read nothing")
    if failures:
        pytest.fail(f"{len(failures)} of the {len(read)} server logs of this module hold a traceback:\n\n"
                    + "\n\n".join(failures), pytrace=False)  # fmt: skip
