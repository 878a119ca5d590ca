"""After every other kind test (tests/kind/conftest.py orders it last): no pod of the in-cluster
operator and no server pod of any service the tier ran restarted or logged an error or a
traceback, unless the test that provoked it declared it (``pod_health.expect``).

What the tier's pod watch saw (podhealth.py): the restart counts and the logs of every container
instance, the previous ones included, of the pods that exist now and of those deleted during the
tier (their namespaces are gone by now).
"""

from __future__ import annotations

import time

import pytest
from podhealth import OPERATOR_NAMESPACE, PodHealth

from fixtures.cluster import DELETED_NAMESPACES, what_holds
from fixtures.support import Kubectl, wait_for

SETTLE_SECONDS = 120
# Every module's namespace, deleted without waiting when the module ended, must be gone by now
# (tests review N4): a namespace stuck terminating is a bug a user meets (an operator's finalizer
# left behind, a claim that cannot be let go).
NAMESPACES_GONE_SECONDS = 180


def test_every_namespace_the_tier_deleted_is_gone(request: pytest.FixtureRequest, kubectl: Kubectl) -> None:
    deleted = request.config.stash.get(DELETED_NAMESPACES, [])

    def there() -> list[str]:
        return [n for n in deleted if kubectl.get("namespace", n) is not None]

    def show() -> str:
        return "\n".join(f"namespace {n} still there:\n{what_holds(kubectl, n)}" for n in there())

    wait_for(there, NAMESPACES_GONE_SECONDS, f"the {len(deleted)} namespaces gone", 2, show, until=lambda t: not t)
    print(f"\n{len(deleted)} namespaces deleted by the tier's modules, all gone")


def test_no_unexpected_restart_or_error_in_the_operator_and_server_pods(
    kubectl: Kubectl, pod_health: PodHealth
) -> None:
    going = pod_health.settle(SETTLE_SECONDS)
    assert not going, f"pods still being deleted after {SETTLE_SECONDS}s, their logs not read to the end: {going}"
    operators = {
        p["metadata"]["uid"]: p["metadata"]["name"]
        for p in kubectl.json("get", "pods", "-n", OPERATOR_NAMESPACE)["items"]
    }
    assert operators, f"no pod in {OPERATOR_NAMESPACE}: the operator the tier ran is not there"
    unseen = [name for uid, name in operators.items() if uid not in pod_health.pods]
    assert not unseen, f"the pod watch never saw the operator's pods {unseen}"
    # The watch and its log streams run in this process: its CPU time is what they cost.
    print(f"\npod health: {pod_health.summary()}; this test process used {time.process_time():.1f}s of CPU")
    problems = pod_health.problems()
    assert not problems, "\n".join(problems)
