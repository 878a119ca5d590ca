"""The kopf handlers: every trigger runs the same level-based reconcile.

The TFDataService's create, update and resume, a periodic resync, and any event on a
child the operator manages (a StatefulSet's status changing, a Service deleted by hand)
all call ``reconcile.reconcile``, which reads everything fresh and converges.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from . import reconcile
from .builders import API_GROUP, KIND, MANAGER, PLURAL
from .kube import Kube, load_client_config

VERSION = "v1alpha1"
MANAGED = {"app.kubernetes.io/managed-by": MANAGER}
log = logging.getLogger(__name__)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
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
    memo.resync = asyncio.create_task(_resync_forever(memo))


@kopf.on.cleanup()
async def stop_resync(memo: kopf.Memo, **_: Any) -> None:
    memo.resync.cancel()


@kopf.on.resume(API_GROUP, VERSION, PLURAL)
@kopf.on.create(API_GROUP, VERSION, PLURAL)
@kopf.on.update(API_GROUP, VERSION, PLURAL)
def reconcile_service(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    reconcile.reconcile(memo.kube, memo.config, namespace or "default", name)


async def _resync_forever(memo: kopf.Memo) -> None:
    """Reconciles every TFDataService periodically, whether or not anything signalled a change.

    A plain task rather than a kopf timer: kopf puts a finalizer on every object with a
    timer, and a TFDataService must stay deletable while the operator is not running.
    """
    config: reconcile.OperatorConfig = memo.config
    while True:
        await asyncio.sleep(config.resync_seconds)
        try:
            names = await asyncio.to_thread(memo.kube.list_services, config.namespaces)
        except Exception as exc:  # the next round tries again; a resync must never stop
            log.warning("Resync could not list TFDataServices: %s", exc)
            continue
        for namespace, name in names:
            try:
                await asyncio.to_thread(reconcile.reconcile, memo.kube, config, namespace, name)
            except Exception:
                log.exception("Resync of %s/%s failed", namespace, name)


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
