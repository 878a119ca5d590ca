"""A child refused by another admission controller of the cluster: said so, nothing else touched, retried.

On a cluster with Kueue, its webhook refuses every replicas change of a worker StatefulSet it
labelled (docs/training-runs.md); any cluster may have such a rule. Here the rule is a
ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, built into the API server: no webhook
server), bound to this module's namespace only, that refuses any change of `spec.replicas` of the
operator's StatefulSets. The service is scaled, and its dispatcher's pod template changed in the same
edit (a change the policy alone would let through): the status and one Warning Event say
ChildRefusedByAdmission with the policy's own message, the dispatcher StatefulSet stays as it was
the whole time, and once the policy is deleted the operator's retries carry the edit out.

A ResourceQuota without room for a child is the same kind of refusal (QuotaExceeded): no child is
created while one cannot be, the quota is named with what it said, and once it is raised the retries
create them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tfdata_operator.api.identity import MANAGED_BY_LABEL, MANAGER

from fixtures.manifests import API_VERSION
from fixtures.support import Kubectl, OperatorProcess, holds_for, on_kwok_nodes, wait_for

NAME = "guarded"
SAYS = "the replicas of the operator's StatefulSets are fixed in this namespace"
TIMEOUT = 60
# The operator retries with back-off (1 s, 2 s, 4 s, ...) and its resync (5 s here) queues it too.
RECOVERY_TIMEOUT = 90
# Long enough for several retries of the refused change.
HOLD_SECONDS = 10


@pytest.fixture(scope="module")
def policy(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """The policy and its binding, both matching this namespace alone (they are cluster-wide objects);
    deleted after the module whatever happened. Yields the policy's name."""
    name = f"tfdata-test-fixed-replicas-{namespace}"
    in_namespace = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": ["statefulsets"],
                        }
                    ],
                    **in_namespace,
                    "objectSelector": {"matchLabels": {MANAGED_BY_LABEL: MANAGER}},
                },
                "validations": [{"expression": "object.spec.replicas == oldObject.spec.replicas", "message": SAYS}],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"], "matchResources": in_namespace},
        },
    ]
    try:
        for obj in objects:
            kubectl.apply(obj)
        yield name
    finally:
        delete_policy(kubectl, name)


def delete_policy(kubectl: Kubectl, name: str) -> None:
    kubectl.run("delete", "validatingadmissionpolicybinding", name, "--ignore-not-found", "--wait")
    kubectl.run("delete", "validatingadmissionpolicy", name, "--ignore-not-found", "--wait")


def statefulset(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return kubectl.get("statefulset", name, "-n", namespace) or {}


def service_status(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    return (kubectl.get("tfdataservice", NAME, "-n", namespace) or {}).get("status") or {}


def ready(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    conditions = service_status(kubectl, namespace).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), {})


def refusal_events(kubectl: Kubectl, namespace: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={NAME},involvedObject.kind=TFDataService,reason=ChildRefusedByAdmission"
    items: list[dict[str, Any]] = kubectl.json("get", "events", "-n", namespace, "--field-selector", selector)["items"]
    return items


def on_kwok(name: str, namespace: str, workers: int) -> dict[str, Any]:
    """A DYNAMIC service whose pods the kwok node runs."""
    service: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "TFDataService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"shardingPolicy": "DYNAMIC", "workers": {"replicas": workers}},
    }
    for part, fields in json.loads(on_kwok_nodes("dispatcher", "workers"))["spec"].items():
        service["spec"][part] = {**service["spec"].get(part, {}), **fields}
    return service


def kept(sts: dict[str, Any]) -> tuple[Any, ...]:
    """What says a StatefulSet was not changed: its generation and spec (its status moves with its pods)."""
    return sts.get("metadata", {}).get("generation"), sts.get("spec")


def test_a_child_refused_by_a_policy_is_said_so_changes_nothing_else_and_goes_through_once_allowed(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, policy: str
) -> None:
    dispatcher, workers = f"{NAME}-dispatcher", f"{NAME}-worker"
    kubectl.apply(on_kwok(NAME, namespace, workers=2))
    wait_for(lambda: service_status(kubectl, namespace), TIMEOUT, f"{NAME} reconciled with 2 workers",
             until=lambda s: (s.get("workers") or {}).get("current") == 2
             and s.get("observedGeneration") == 1 and statefulset(kubectl, namespace, dispatcher)
             and "ChildRefusedByAdmission" not in json.dumps(s))  # fmt: skip

    # The policy is in force once the API server refuses a scale of the workers (its informers take a moment).
    def dry_run_scale() -> str:
        scale = ["patch", "statefulset", workers, "-n", namespace, "--type=merge", "-p", '{"spec": {"replicas": 5}}']
        return kubectl.run(*scale, "--dry-run=server", check=False).stderr

    wait_for(dry_run_scale, TIMEOUT, f"ValidatingAdmissionPolicy {policy} to refuse a scale of {workers}",
             until=lambda stderr: SAYS in stderr)  # fmt: skip
    before = kept(statefulset(kubectl, namespace, dispatcher))

    # A scale, and a change of both pod templates: the dispatcher's alone would pass the policy.
    edit = {"spec": {"workers": {"replicas": 3}, "imagePullPolicy": "Always"}}
    kubectl.run("patch", "tfdataservice", NAME, "-n", namespace, "--type=merge", "-p", json.dumps(edit))
    refused = wait_for(lambda: ready(kubectl, namespace), TIMEOUT, "Ready to say ChildRefusedByAdmission",
                       until=lambda c: c.get("reason") == "ChildRefusedByAdmission")  # fmt: skip
    assert refused["status"] == "False", refused
    message = refused["message"]
    assert f"refused the StatefulSet {workers}: ValidatingAdmissionPolicy '{policy}' with binding '{policy}'" in (
        message
    )
    assert SAYS in message and "Not an error in the spec" in message and "cluster administrator" in message

    def refused_throughout() -> tuple[Any, ...]:
        return (
            ready(kubectl, namespace).get("reason"),
            kept(statefulset(kubectl, namespace, dispatcher)) == before,
            statefulset(kubectl, namespace, workers).get("spec", {}).get("replicas"),
            [(e["type"], e.get("count", 1), e["message"]) for e in refusal_events(kubectl, namespace)],
        )

    # While the policy stands, the operator retries (its reconciles metric counts them), changes nothing, says it once.
    holds_for(
        refused_throughout,
        HOLD_SECONDS,
        "the refusal, said once, with the dispatcher untouched and 2 workers",
        ok=lambda seen: seen[:3] == ("ChildRefusedByAdmission", True, 2) and seen[3] == [("Warning", 1, message)],
        interval=1,
    )
    assert operator.reconciles(namespace, NAME).get("refused", 0) >= 2, operator.reconciles(namespace, NAME)

    delete_policy(kubectl, policy)
    wait_for(
        lambda: (service_status(kubectl, namespace), statefulset(kubectl, namespace, workers)),
        RECOVERY_TIMEOUT,
        "the scale to 3 workers carried out once the policy is gone",
        until=lambda seen: (
            seen[1].get("spec", {}).get("replicas") == 3
            and (seen[0].get("workers") or {}).get("current") == 3
            and "ChildRefusedByAdmission" not in json.dumps(seen[0].get("conditions"))
        ),
        show=lambda: (ready(kubectl, namespace), operator.tail(10)),
    )
    after = statefulset(kubectl, namespace, dispatcher)
    assert kept(after) != before, "the dispatcher's part of the edit was carried out too"
    assert after["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "Always"
    assert len(refusal_events(kubectl, namespace)) == 1


QUOTA_NAME = "quota-bound"


def test_a_child_a_quota_has_no_room_for_is_said_so_creates_nothing_and_goes_through_once_raised(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    quota = f"tfdata-test-services-{namespace}"[:63]
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": quota, "namespace": namespace},
            "spec": {"hard": {"services": "0"}},
        }
    )
    # The quota admission plugin refuses on the quota's status, which the controller-manager writes.
    wait_for(lambda: kubectl.get("resourcequota", quota, "-n", namespace) or {}, TIMEOUT, f"{quota}'s status",
             until=lambda q: "services" in ((q.get("status") or {}).get("hard") or {}))  # fmt: skip
    kubectl.apply(on_kwok(QUOTA_NAME, namespace, workers=1))

    def condition() -> dict[str, Any]:
        got = (kubectl.get("tfdataservice", QUOTA_NAME, "-n", namespace) or {}).get("status") or {}
        return next((c for c in got.get("conditions") or [] if c["type"] == "Ready"), {})

    said = wait_for(
        condition, TIMEOUT, "Ready to say QuotaExceeded", until=lambda c: c.get("reason") == "QuotaExceeded"
    )
    assert said["status"] == "False", said
    assert f"The ResourceQuota {quota} of namespace {namespace} has no room for the Service" in said["message"], said
    assert "limited: services=0" in said["message"] and "kubectl describe resourcequota" in said["message"], said

    def children() -> list[str]:
        listed = kubectl.json(
            "get", "statefulsets,services", "-n", namespace, "-l", f"app.kubernetes.io/instance={QUOTA_NAME}"
        )
        return [f"{o['kind']}/{o['metadata']['name']}" for o in listed["items"]]

    holds_for(lambda: (condition().get("reason"), children()), 5, "QuotaExceeded, no child created",
              ok=lambda seen: seen == ("QuotaExceeded", []), interval=1)  # fmt: skip

    kubectl.run(
        "patch", "resourcequota", quota, "-n", namespace, "--type=merge", "-p", '{"spec": {"hard": {"services": "10"}}}'
    )
    wait_for(
        lambda: (condition(), children()),
        RECOVERY_TIMEOUT,
        "the children created once the quota has room",
        until=lambda seen: (
            seen[0].get("reason") != "QuotaExceeded" and f"StatefulSet/{QUOTA_NAME}-dispatcher" in seen[1]
        ),
        show=lambda: operator.tail(10),
    )
    kubectl.run("delete", "resourcequota", quota, "-n", namespace, "--ignore-not-found")
