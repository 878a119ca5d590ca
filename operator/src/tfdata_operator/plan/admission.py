"""A child refused by another admission controller of the cluster, told apart from a refusal of the spec.

When a webhook or a ValidatingAdmissionPolicy refuses a child, the spec is not what is wrong: the
service says which controller refused which child and what it said, that a cluster administrator
decides, and the operator tries again with back-off (``reasons.CHILD_REFUSED_BY_ADMISSION``).
Which refusals those are is read from the API server's answer (its ``Status``), whose message
kube-apiserver itself writes around the controller's own words:

- a webhook's denial (``ToStatusErr``, ``k8s.io/apiserver/pkg/admission/plugin/webhook/errors/
  statuserror.go``): ``admission webhook "<webhook>" denied the request: <its message>`` (or
  ``... without explanation``), with the code the webhook chose (400 at least; controller-runtime's
  webhooks, Kueue's among them, say 403). Newer API servers put ``<resource> "<object>" is
  forbidden: `` (``Internal error occurred: `` for a 500) before it. The operator's dry run of
  every change meets the same denial: admissionregistration.k8s.io/v1 webhooks have no side effects
  on a dry run (``sideEffects`` None or NoneOnDryRun), so the API server calls them for it.
- a ValidatingAdmissionPolicy's denial (``policy/validating/dispatcher.go``): ``<resource> "<object>"
  is forbidden: ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request:
  <message>`` (``... '<policy>' denied request: ...`` when the policy itself is broken), with the code
  of the validation's reason: 422 for Invalid, the default.

A ResourceQuota of the namespace without room for a child is told apart too (``quota``,
``reasons.QUOTA_EXCEEDED``): the quota admission plugin (``plugin/pkg/admission/resourcequota/
controller.go``) says ``<resource> "<object>" is forbidden: exceeded quota: <quota>, requested: ...,
used: ..., limited: ...`` (403), and its check runs on a dry run too. The API server's own validation
(``<Kind> "<object>" is invalid: ...``, 422) and a webhook the API server cannot call (``failed calling
webhook``, 500, a failure that passes) match none of them. The shapes are anchored at the message's start: the
object's name is the operator's, and a value the spec sets that quotes them is quoted later.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfdata_operator.api import kueue, limits

Manifest = dict[str, Any]

WEBHOOK, POLICY = "webhook", "policy"

# At most this much of what the admission controller said is quoted: the message must still say what to
# do, and an Event's message holds 1,024 characters in all (``limits.EVENT_MESSAGE``).
QUOTED = 320

# apierrors.NewForbidden's "<resource>[ "<name>"] is forbidden: " (or "forbidden: " without a resource),
# or NewInternalError's "Internal error occurred: ", which newer API servers put first.
_PREFIX = r'(?:(?:[a-z0-9.-]+(?: "[^"]*")? is )?forbidden: |Internal error occurred: )?'
_WEBHOOK = re.compile(
    _PREFIX + r'(?P<said>admission webhook "(?P<name>[^"]*)" '
    r"denied the request(?::.*| without explanation))\Z",
    re.DOTALL,
)
_POLICY = re.compile(
    _PREFIX + r"(?P<said>ValidatingAdmissionPolicy '(?P<name>[^']*)'(?: with binding '[^']*')? denied request: .*)\Z",
    re.DOTALL,
)

_QUOTA = re.compile(
    r'(?:[a-z0-9.-]+(?: "[^"]*")? is )?forbidden: (?P<said>exceeded quota: (?P<name>[a-z0-9.-]{1,253}), .*)\Z',
    re.DOTALL,
)

# The label Kueue's webhook puts on a StatefulSet it manages (its queue's name), and the name that
# makes a TFDataService a kind Kueue knows: api/kueue.py.
KUEUE_QUEUE_LABEL, KUEUE_FRAMEWORK = kueue.QUEUE_LABEL, kueue.FRAMEWORK


@dataclass(frozen=True)
class Denial:
    """Who refused (``WEBHOOK`` or ``POLICY``, and its name), and the API
    server's words for it from the controller's name on (its message included)."""

    source: str
    name: str
    said: str


def denial(code: int, status: Mapping[str, Any] | None) -> Denial | None:
    """The admission controller's refusal in the API server's answer (``code``, and its body parsed:
    a ``Status``), or None when it is not one."""
    if code < 400 or not isinstance(status, Mapping):
        return None
    message = status.get("message")
    if not isinstance(message, str):
        return None
    if found := _WEBHOOK.match(message):
        return Denial(WEBHOOK, found["name"], found["said"])
    if found := _POLICY.match(message):
        return Denial(POLICY, found["name"], found["said"])
    return None


def quota(code: int, status: Mapping[str, Any] | None) -> Denial | None:
    """The ResourceQuota that has no room for the child, from the API server's answer (403 and its
    ``Status``), or None when the refusal is another."""
    if code != 403 or not isinstance(status, Mapping) or not isinstance(message := status.get("message"), str):
        return None
    found = _QUOTA.match(message)
    return Denial("quota", found["name"], found["said"]) if found else None


def explain_quota(manifest: Manifest, refused: Denial) -> str:
    """The condition's and the Warning's message for a child a quota has no room for: which child,
    which quota and what it said (requested, used, limited), and what to do."""
    what = f"{manifest['kind']} {manifest['metadata']['name']}"
    said = limits.clip(refused.said, QUOTED).rstrip(".")
    namespace = manifest["metadata"].get("namespace", "")
    return (
        f"The ResourceQuota {refused.name} of namespace {namespace} has no room for the {what}: {said}. The "
        f"{what} stays as it was, and the operator tries again with back-off. Delete what else uses the quota, "
        "ask for less in the spec, or ask your cluster administrator to raise it (kubectl describe resourcequota "
        f"{refused.name} -n {namespace})."
    )


def explain(manifest: Manifest, refused: Denial, live: Manifest | None) -> str:
    """The condition's and the Warning's message: which child, who refused it and what it said (cut
    to ``QUOTED``, on one line), that the spec is not at fault, and what to do. ``live`` is the child
    as it runs (None: not created yet); a label Kueue put on it names Kueue's fix."""
    what = f"{manifest['kind']} {manifest['metadata']['name']}"
    said = limits.clip(refused.said, QUOTED).rstrip(".")
    labels = ((live or {}).get("metadata") or {}).get("labels") or {}
    head = (
        f"An admission controller of the cluster refused the {what}: {said}. Not an error in the spec: "
        "the other children stay as they are, and the operator tries again with back-off."
    )
    if KUEUE_QUEUE_LABEL in labels:
        return (
            f"{head} Kueue manages it (label {KUEUE_QUEUE_LABEL}) and refuses a change of its replicas "
            "other than to or from 0, and of its pod template. Ask your cluster administrator to "
            f'add "{KUEUE_FRAMEWORK}" to integrations.externalFrameworks in Kueue\'s Configuration and let '
            "Kueue's manager read TFDataServices, or to leave this namespace out of Kueue's "
            "managedJobsNamespaceSelector (docs/training-runs.md)."
        )
    if refused.source == POLICY:
        where = f"ValidatingAdmissionPolicy {refused.name} and its bindings"
    else:
        where = f"webhook {refused.name} (kubectl get validatingwebhookconfigurations,mutatingwebhookconfigurations)"
    return f"{head} Ask your cluster administrator whether the {where} should apply to this service's children."
