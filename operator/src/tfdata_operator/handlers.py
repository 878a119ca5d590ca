"""The kopf handlers: every trigger runs the same level-based reconcile.

The TFDataService's create, update and resume, a periodic resync, and any event on a
child the operator manages (a StatefulSet's status changing, a Service deleted by hand)
all call ``reconcile.reconcile``, which reads everything fresh and converges.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from . import reconcile
from .builders import API_GROUP, KIND, MANAGER, PLURAL
from .kube import Kube, load_client_config

VERSION = "v1alpha1"
MANAGED = {"app.kubernetes.io/managed-by": MANAGER}
# How often every TFDataService is reconciled even when nothing signals a change.
RESYNC_SECONDS = 60.0


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Keep kopf's bookkeeping in annotations: the CRD's structural schema has no status.kopf.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    # The operator records its own events; kopf's would be one per handler run.
    settings.posting.level = logging.WARNING
    # Restart watches regularly, so a silently broken connection is noticed.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.execution.max_workers = 8
    memo.kube = Kube(load_client_config())


@kopf.on.resume(API_GROUP, VERSION, PLURAL)
@kopf.on.create(API_GROUP, VERSION, PLURAL)
@kopf.on.update(API_GROUP, VERSION, PLURAL)
def reconcile_service(name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    reconcile.reconcile(memo.kube, memo.config, namespace, name)


@kopf.timer(API_GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync(name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    reconcile.reconcile(memo.kube, memo.config, namespace, name)


def _reconcile_owner(body: kopf.Body, memo: kopf.Memo) -> None:
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(f"{API_GROUP}/") and ref.get("controller"):
            reconcile.reconcile(memo.kube, memo.config, body["metadata"]["namespace"], ref["name"])


@kopf.on.event("apps", "v1", "statefulsets", labels=MANAGED)
def statefulset_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _reconcile_owner(body, memo)


@kopf.on.event("", "v1", "services", labels=MANAGED)
def service_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _reconcile_owner(body, memo)


@kopf.on.event("autoscaling", "v2", "horizontalpodautoscalers", labels=MANAGED)
def hpa_changed(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _reconcile_owner(body, memo)


def new_memo(config: reconcile.OperatorConfig) -> kopf.Memo:
    memo = kopf.Memo()
    memo.config = config
    return memo
