"""A child refused by another admission controller of the cluster is told apart from a refusal of the
spec (plan/admission.py), from the API server's own answers.

The answers marked "kube-apiserver 1.34.4" were sent by the project's pinned kube-apiserver to the
operator's dry-run server-side apply of a StatefulSet `feed-worker` (a scale from 2 to 3): refused by a
ValidatingAdmissionPolicy, by a validating webhook answering as controller-runtime's `Denied` (Kueue's
webhooks do), by the API server's own validation, and for a webhook it could not call. The others
are the shapes newer API servers write (``ToStatusErr`` at kubernetes master: a "<resource> "<name>" is
forbidden: " prefix, "Internal error occurred: " for a 500).
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tfdata_operator.api import limits
from tfdata_operator.controller import cache, handlers, kube
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.workqueue import WorkQueue
from tfdata_operator.plan import admission, children

from fixtures.fakes import FakeApi, service

# kube-apiserver 1.34.4.
POLICY_DENIED: dict[str, Any] = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "statefulsets.apps \"feed-worker\" is forbidden: ValidatingAdmissionPolicy 'no-replica-changes' with "
    "binding 'no-replica-changes-cap' denied request: the number of replicas is fixed in this namespace",
    "reason": "Invalid",
    "details": {
        "name": "feed-worker",
        "group": "apps",
        "kind": "statefulsets",
        "causes": [
            {
                "message": "ValidatingAdmissionPolicy 'no-replica-changes' with binding 'no-replica-changes-cap' "
                "denied request: the number of replicas is fixed in this namespace"
            }
        ],
    },
    "code": 422,
}
# kube-apiserver 1.34.4.
WEBHOOK_DENIED: dict[str, Any] = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'admission webhook "vstatefulset.kb.io" denied the request: spec.replicas: Invalid value: 3: '
    "field is immutable",
    "reason": "Forbidden",
    "code": 403,
}
# kube-apiserver 1.34.4: its own validation.
INVALID: dict[str, Any] = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'StatefulSet.apps "feed-worker" is invalid: spec.template.spec.containers[0].image: Required value',
    "reason": "Invalid",
    "details": {
        "name": "feed-worker",
        "group": "apps",
        "kind": "StatefulSet",
        "causes": [
            {
                "reason": "FieldValueRequired",
                "message": "Required value",
                "field": "spec.template.spec.containers[0].image",
            }
        ],
    },
    "code": 422,
}
# kube-apiserver 1.34.4: a webhook it could not call (a failure that passes: retried as any other).
UNREACHABLE: dict[str, Any] = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'Internal error occurred: failed calling webhook "vstatefulset.kb.io": failed to call webhook: '
    'Post "https://127.0.0.1:41443/validate?timeout=5s": context deadline exceeded',
    "reason": "InternalError",
    "details": {
        "causes": [
            {
                "message": 'failed calling webhook "vstatefulset.kb.io": failed to call webhook: Post '
                '"https://127.0.0.1:41443/validate?timeout=5s": context deadline exceeded'
            }
        ]
    },
    "code": 500,
}


def refusal(status: dict[str, Any]) -> ApiException:
    """What ``kube.Kube.call`` raises for the API server's answer."""
    return ApiException(status=status["code"], reason=status.get("reason"), body=json.dumps(status))


@pytest.mark.parametrize(
    ("status", "source", "name", "said"),
    [
        (
            POLICY_DENIED,
            admission.POLICY,
            "no-replica-changes",
            "ValidatingAdmissionPolicy 'no-replica-changes' with binding 'no-replica-changes-cap' denied request: "
            "the number of replicas is fixed in this namespace",
        ),
        (
            WEBHOOK_DENIED,
            admission.WEBHOOK,
            "vstatefulset.kb.io",
            'admission webhook "vstatefulset.kb.io" denied the request: spec.replicas: Invalid value: 3: '
            "field is immutable",
        ),
        # Newer API servers: the same denial after NewForbidden's prefix.
        (
            {**WEBHOOK_DENIED, "message": 'statefulsets.apps "feed-worker" is forbidden: ' + WEBHOOK_DENIED["message"]},
            admission.WEBHOOK,
            "vstatefulset.kb.io",
            WEBHOOK_DENIED["message"],
        ),
        # A webhook that said nothing, and chose 500 (newer: "Internal error occurred: " first).
        (
            {
                "code": 500,
                "message": 'Internal error occurred: admission webhook "policy.example.com" denied the request '
                "without explanation",
            },
            admission.WEBHOOK,
            "policy.example.com",
            'admission webhook "policy.example.com" denied the request without explanation',
        ),
        # A webhook's many-line answer (Gatekeeper's, say), and a 400 (the least the API server lets a denial have).
        (
            {"code": 400, "message": 'admission webhook "validation.gatekeeper.sh" denied the request:\n- a\n- b'},
            admission.WEBHOOK,
            "validation.gatekeeper.sh",
            'admission webhook "validation.gatekeeper.sh" denied the request:\n- a\n- b',
        ),
        # A broken policy with failurePolicy Fail: no binding named.
        (
            {
                "code": 422,
                "message": "services \"feed-worker\" is forbidden: ValidatingAdmissionPolicy 'p' denied request: "
                "failed to configure policy: paramKind not found",
            },
            admission.POLICY,
            "p",
            "ValidatingAdmissionPolicy 'p' denied request: failed to configure policy: paramKind not found",
        ),
    ],
)
def test_the_api_servers_answer_to_an_admission_denial_names_the_controller(
    status: dict[str, Any], source: str, name: str, said: str
) -> None:
    found = kube.admission_denial(refusal(status))
    assert found == admission.Denial(source, name, said)


@pytest.mark.parametrize(
    "status",
    [
        INVALID,
        UNREACHABLE,
        # The API server's own validation quoting a value the spec set, which looks like a denial.
        {
            **INVALID,
            "message": 'StatefulSet.apps "feed-worker" is invalid: metadata.labels: Invalid value: '
            '"admission webhook \\"x\\" denied the request: no": a valid label must be 63 characters or less',
        },
        {**INVALID, "message": "spec.x: Invalid value: \"ValidatingAdmissionPolicy 'p' denied request: no\""},
        # Other admission plugins of the API server itself: a quota, a terminating namespace.
        {"code": 403, "message": 'statefulsets.apps "feed-worker" is forbidden: exceeded quota: q, requested: pods=3'},
        {
            "code": 403,
            "message": 'services "feed-worker" is forbidden: unable to create new content in namespace ml because '
            "it is being terminated",
            "details": {"causes": [{"reason": "NamespaceTerminating"}]},
        },
        # A policy's warning is no refusal; a success is none either.
        {"code": 422, "message": "Validation failed for ValidatingAdmissionPolicy 'p' with binding 'b': no"},
        {**WEBHOOK_DENIED, "code": 200},
        # No Status at all: a proxy's page, an empty body.
        {"code": 403},
        {"code": 502, "message": None},
    ],
)
def test_other_refusals_are_not_admission_denials(status: dict[str, Any]) -> None:
    assert kube.admission_denial(refusal(status)) is None


def test_a_body_that_is_not_json_or_not_an_api_answer_is_no_denial() -> None:
    assert kube.admission_denial(ApiException(status=403, reason="Forbidden", body="<html>denied</html>")) is None
    assert kube.admission_denial(ApiException(status=403, reason="Forbidden", body='"a string"')) is None
    assert kube.admission_denial(ApiException(status=403, reason="Forbidden")) is None
    assert kube.admission_denial(ValueError(WEBHOOK_DENIED["message"])) is None


WORKER = {"kind": "StatefulSet", "metadata": {"name": "feed-worker"}}


def test_the_message_names_the_child_quotes_the_controller_and_says_what_to_do() -> None:
    found = admission.denial(422, POLICY_DENIED)
    assert found is not None
    message = admission.explain(WORKER, found, {"metadata": {"labels": {"app": "x"}}})
    assert message == (
        "An admission controller of the cluster refused the StatefulSet feed-worker: ValidatingAdmissionPolicy "
        "'no-replica-changes' with binding 'no-replica-changes-cap' denied request: the number of replicas is fixed "
        "in this namespace. Not an error in the spec: the other children stay as they are, and the operator tries "
        "again with back-off. Ask your cluster administrator whether the ValidatingAdmissionPolicy "
        "no-replica-changes and its bindings should apply to this service's children."
    )
    webhook = admission.denial(403, WEBHOOK_DENIED)
    assert webhook is not None
    said = admission.explain(WORKER, webhook, None)
    assert said.startswith(
        "An admission controller of the cluster refused the StatefulSet feed-worker: "
        'admission webhook "vstatefulset.kb.io"'
    )
    assert "webhook vstatefulset.kb.io (kubectl get validatingwebhookconfigurations,mutatingwebhookconfigurations)" in (
        said
    )


def test_a_statefulset_kueue_labelled_gets_kueues_fix() -> None:
    found = admission.denial(403, WEBHOOK_DENIED)
    assert found is not None
    live = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "default"}}}
    message = admission.explain(WORKER, found, live)
    assert "field is immutable. Not an error in the spec" in message
    assert "Kueue manages it (label kueue.x-k8s.io/queue-name)" in message
    assert '"TFDataService.v1alpha1.tfdata.dev" to integrations.externalFrameworks' in message
    assert "docs/training-runs.md" in message
    # Without Kueue's label, no word of Kueue: the webhook's name (kubebuilder's .kb.io) is not Kueue's alone.
    assert "Kueue" not in admission.explain(WORKER, found, {"metadata": {}})


def test_what_the_controller_said_is_cut_and_cleaned_and_the_advice_stays_within_an_event() -> None:
    # A webhook's answer: terminal escapes, control characters, many lines, far more than an Event holds.
    said = "\x1b[31mred\x1b[0m \u202eevil\x07\n" + "- a rule was broken\n" * 2_000
    found = admission.denial(403, {"message": f'admission webhook "policy.example.com" denied the request: {said}'})
    assert found is not None
    name = "n" * 41 + "-dispatcher"  # the longest child name a valid service has
    live = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "default"}}}
    for message in (
        admission.explain({"kind": "StatefulSet", "metadata": {"name": name}}, found, live),
        admission.explain({"kind": "PodDisruptionBudget", "metadata": {"name": name}}, found, None),
    ):
        assert "red evil - a rule was broken - a rule" in message
        assert not any(c in message for c in "\x1b\x07\n\u202e")
        assert "…. Not an error in the spec" in message
        # The Event (cut at 1,024 characters) still says what to do.
        assert len(message) <= limits.EVENT_MESSAGE, len(message)
        assert message.endswith("should apply to this service's children.") or message.endswith(
            "(docs/training-runs.md)."
        )


# --- The work queue's retry (controller/handlers.py) -----------------------------------------------


async def reconciled(api: FakeApi, body: dict[str, Any]) -> bool:
    """What ``handlers._reconcile`` tells the queue for service ml/demo: False, try again after the back-off."""
    memo = handlers.new_memo(OperatorConfig(server_image="tfdata-server:test"))
    memo.indices = {kind.index: {} for kind in children.OBSERVED}
    memo.indices |= {handlers.SERVICES_INDEX: {("ml", "demo"): [cache.pack(body)]}, handlers.DIRECTORIES_INDEX: {}}
    memo.kube, memo.queue, memo.pool = api, WorkQueue(), ThreadPoolExecutor(max_workers=1)  # type: ignore[assignment]
    memo.indexed.set()
    try:
        return await handlers._reconcile(memo, ("ml", "demo"))
    finally:
        memo.pool.shutdown()


def test_the_operator_retries_a_refusal_by_admission_with_back_off_and_not_a_spec_error() -> None:
    """``handlers._reconcile`` tells the queue to retry (after its back-off) a service whose child an admission
    controller refused; an invalid spec waits for the next edit."""
    api = FakeApi()
    denied = refusal({**POLICY_DENIED, "message": POLICY_DENIED["message"].replace("feed-worker", "demo-worker")})

    api.refuse[("StatefulSet", "demo-worker")] = denied
    assert asyncio.run(reconciled(api, service())) is False
    assert [r for _, r, _ in api.events] == ["ChildRefusedByAdmission"]
    del api.refuse[("StatefulSet", "demo-worker")]
    assert asyncio.run(reconciled(api, service(shardingPolicy="SIDEWAYS"))) is True
    assert [r for _, r, _ in api.events] == ["ChildRefusedByAdmission", "InvalidSpec"]


# The quota admission plugin's answer (plugin/pkg/admission/resourcequota/controller.go: admission.NewForbidden
# around "exceeded quota: %s, requested: %s, used: %s, limited: %s"), to a dry run and to a create alike.
QUOTA_EXCEEDED: dict[str, Any] = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": 'services "demo-dispatcher" is forbidden: exceeded quota: team-quota, requested: services=1, '
    "used: services=4, limited: services=4",
    "reason": "Forbidden",
    "details": {"name": "demo-dispatcher", "kind": "services"},
    "code": 403,
}


def test_a_quota_without_room_is_named_with_what_it_said_and_what_to_do() -> None:
    refused = kube.quota_refusal(refusal(QUOTA_EXCEEDED))
    assert refused is not None and refused.name == "team-quota"
    assert kube.admission_denial(refusal(QUOTA_EXCEEDED)) is None
    message = admission.explain_quota(
        {"kind": "Service", "metadata": {"name": "demo-dispatcher", "namespace": "ml"}}, refused
    )
    assert message.startswith(
        "The ResourceQuota team-quota of namespace ml has no room for the Service demo-dispatcher"
    )
    assert "requested: services=1, used: services=4, limited: services=4" in message
    assert "kubectl describe resourcequota team-quota -n ml" in message and "stays as it was" in message
    assert len(message) <= limits.EVENT_MESSAGE


@pytest.mark.parametrize(
    "status",
    [
        {**QUOTA_EXCEEDED, "code": 422},  # only the plugin's 403
        {**QUOTA_EXCEEDED, "message": 'services "x" is forbidden: status unknown for quota: team-quota'},
        {**QUOTA_EXCEEDED, "message": 'services "x" is invalid: metadata.name: "exceeded quota: q, a"'},
        {**QUOTA_EXCEEDED, "message": "exceeded quota"},
        POLICY_DENIED,
        {"code": 403},
    ],
)
def test_other_refusals_are_not_a_quota(status: dict[str, Any]) -> None:
    assert kube.quota_refusal(refusal(status)) is None


def test_the_operator_retries_a_child_a_quota_has_no_room_for_and_says_quota_exceeded() -> None:
    api = FakeApi()

    api.refuse[("Service", "demo-dispatcher")] = refusal(QUOTA_EXCEEDED)
    assert asyncio.run(reconciled(api, service())) is False
    assert [r for _, r, _ in api.events] == ["QuotaExceeded"]
    assert not api.objects, "nothing is created while one child cannot be"
    del api.refuse[("Service", "demo-dispatcher")]
    # Used up between the dry run and the change: the others are made, the one without room said the same way.
    api.refuse_apply[("StatefulSet", "demo-worker")] = refusal(QUOTA_EXCEEDED)
    assert asyncio.run(reconciled(api, service())) is False
    assert [r for _, r, _ in api.events][-1] == "QuotaExceeded", api.events
    assert ("StatefulSet", "demo-dispatcher") in api.objects and ("StatefulSet", "demo-worker") not in api.objects
    del api.refuse_apply[("StatefulSet", "demo-worker")]
    assert asyncio.run(reconciled(api, service())) is True
