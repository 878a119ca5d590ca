"""A TFDataService's status, written only when it differs, and a refusal said once: ``Ready=False``
with its reason, and one Warning event (not one per reconcile).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from tfdata_operator.api import reasons, spec
from tfdata_operator.api.identity import API_VERSION, KIND
from tfdata_operator.controller.config import OperatorConfig
from tfdata_operator.controller.interface import Api, Manifest, Outcome
from tfdata_operator.plan import desired as plan
from tfdata_operator.plan import status

log = logging.getLogger(__name__)


@dataclass
class Reporter:
    """Writes the status, and the Warning event of a refusal once (not on every reconcile)."""

    api: Api
    config: OperatorConfig
    body: Manifest
    children: plan.Children
    now: str
    outcome: Outcome

    def refused(self, svc: spec.ServiceSpec | None, message: str, reason: str = reasons.INVALID_SPEC) -> None:
        observed = status.Servers(dispatcher=self.children.dispatcher, workers=self.children.workers)
        new_status = status.compute_status(
            svc, self.body, observed, self.config.build, self.now, invalid=message, reason=reason
        )
        old_ready, new_ready = _ready_condition(self.body.get("status")), _ready_condition(new_status)
        # Compared as written (the message cut to the CRD's bound): one Event per refusal, not one per reconcile.
        if (old_ready.get("reason"), old_ready.get("message")) != (new_ready.get("reason"), new_ready.get("message")):
            meta = self.body["metadata"]
            log.warning("%s/%s: %s", meta["namespace"], meta["name"], message)
            self.api.event(self.body, "Warning", reason, message)
        self.outcome.result = _RESULTS.get(reason, "invalid")
        self.write(new_status)

    def refused_by_admission(self, svc: spec.ServiceSpec, message: str) -> None:
        """Another admission controller of the cluster refused a child: said as a refusal, then tried
        again with back-off (``Outcome.retry``), as it may let the change through later."""
        self.refused(svc, message, reason=reasons.CHILD_REFUSED_BY_ADMISSION)
        self.outcome.retry = True

    def refused_by_quota(self, svc: spec.ServiceSpec, message: str) -> None:
        """A ResourceQuota of the namespace has no room for a child: said as a refusal, then tried
        again with back-off, as the quota may be raised or what else uses it deleted."""
        self.refused(svc, message, reason=reasons.QUOTA_EXCEEDED)
        self.outcome.retry = True

    def conflict(self, svc: spec.ServiceSpec, taken: list[tuple[str, str]]) -> None:
        what = ", ".join(f"{kind} {child}" for kind, child in taken)
        namespace = self.body["metadata"]["namespace"]
        message = (
            f"{what} already exist(s) in namespace {namespace} and do(es) not belong to this TFDataService; "
            "nothing was changed. Delete or rename them, or give this TFDataService another name."
        )
        self.refused(svc, message, reason=reasons.NAME_CONFLICT)

    def write(self, new_status: Manifest) -> None:
        if not status.status_differs(self.body.get("status"), new_status):
            return
        meta = self.body["metadata"]
        try:
            written = self.api.patch_status(API_VERSION, KIND, meta["namespace"], meta["name"], new_status)
        except ApiException as exc:
            if exc.status != 404:  # deleted meanwhile: nothing left to report on
                raise
            return
        self.outcome.written.append(written)
        if self.outcome.result == "idle":
            self.outcome.result = "changed"


# The reconcile's result (the reconciles metric) of a refusal, by its reason; any other: "invalid".
_RESULTS = {
    reasons.NAME_CONFLICT: "conflict",
    reasons.CHILD_REFUSED_BY_ADMISSION: "refused",
    reasons.QUOTA_EXCEEDED: "refused",
}


def _ready_condition(status: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == reasons.READY), {})
