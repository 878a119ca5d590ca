"""One level-based reconcile of a TFDataService: observe, plan, apply what differs, report.

Every entry point (create, update, resume, a child's event, the periodic resync) runs
the same ``reconcile``: it reads the resource and its children fresh, so it converges
from any starting point, repairs drift, and writes nothing when nothing differs. An
invalid spec changes no child: it only sets ``Ready=False``/``InvalidSpec`` and records
a Warning event once.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kubernetes.client.exceptions import ApiException

from . import builders, scaling, spec, status
from .builders import API_VERSION, KIND, BuildSettings
from .kube import Kube, describe_api_error

log = logging.getLogger(__name__)
Manifest = dict[str, Any]


@dataclass(frozen=True)
class OperatorConfig:
    """Settings of one operator process."""

    server_image: str | None = None
    build: BuildSettings = field(default_factory=BuildSettings)
    # Empty means every namespace.
    namespaces: tuple[str, ...] = ()
    # How often every TFDataService is reconciled even when nothing signals a change.
    resync_seconds: float = 60.0


@dataclass(frozen=True)
class Children:
    """What exists now: the children by (kind, name), and every pod of the service."""

    name: str
    objects: Mapping[tuple[str, str], Manifest] = field(default_factory=dict)
    pods: list[Manifest] = field(default_factory=list)
    # Objects with a child's name that this TFDataService does not own: never touched.
    foreign: list[tuple[str, str]] = field(default_factory=list)

    def get(self, kind: str, name: str) -> Manifest | None:
        return self.objects.get((kind, name))

    @property
    def dispatcher(self) -> Manifest | None:
        return self.get("StatefulSet", builders.dispatcher_name(self.name))

    @property
    def workers(self) -> Manifest | None:
        return self.get("StatefulSet", builders.workers_name(self.name))

    def pods_of(self, component: str) -> list[Manifest]:
        return [p for p in self.pods if p["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component]

    def pod_names(self, component: str) -> list[str]:
        return [p["metadata"]["name"] for p in self.pods_of(component)]


@dataclass(frozen=True)
class Desired:
    """The children this reconcile should converge to, in the order they are applied."""

    apply: list[Manifest]
    delete: list[tuple[str, str, str]]  # api version, kind, name
    waiting: str | None


_locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
_locks_guard = threading.Lock()


def _lock_for(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks[(namespace, name)]


def observe(kube: Kube, namespace: str, name: str, uid: str) -> Children:
    objects, foreign = {}, []
    for api_version, kind, name_of in builders.CHILD_TYPES:
        obj = kube.get(api_version, kind, namespace, name_of(name))
        if obj is None:
            continue
        if _owned_by(obj, uid):
            objects[(kind, obj["metadata"]["name"])] = obj
        else:
            foreign.append((kind, obj["metadata"]["name"]))
    pods = kube.list_objects("v1", "Pod", namespace, {**builders.instance_labels(name), **builders.MANAGED_BY})
    return Children(name=name, objects=objects, pods=pods, foreign=foreign)


def desired_children(svc: spec.ServiceSpec, settings: BuildSettings, children: Children) -> Desired:
    """The pure part of a reconcile: what the children should be now, given what they are."""
    live_config = builders.read_config(children.dispatcher)
    live_list = scaling.live_worker_list(live_config)
    step = scaling.plan(
        svc,
        children.workers,
        children.dispatcher,
        children.pods_of(builders.DISPATCHER),
        live_list,
        lambda n: builders.worker_addresses(svc, settings, n),
        scaling.highest_ordinal_plus_one(children.pod_names(builders.WORKER), builders.workers_name(svc)),
    )
    apply = [
        builders.build_dispatcher_service(svc, settings),
        builders.build_worker_service(svc, settings),
        builders.build_dispatcher_statefulset(
            svc,
            settings,
            step.dispatcher_workers,
            builders.static_journal(svc, settings, step.dispatcher_workers, live_config),
        ),
        builders.build_worker_statefulset(svc, settings, step.worker_replicas),
    ]
    delete = []
    for api_version, kind, name, manifest in builders.optional_children(svc):
        if manifest is not None:
            apply.append(manifest)
        elif (live := children.get(kind, name)) is not None and _owned_by(live, svc.uid):
            delete.append((api_version, kind, name))
    return Desired(apply=apply, delete=delete, waiting=step.waiting)


def needs_apply(desired: Any, live: Any) -> bool:
    """Whether ``live`` lacks any part of ``desired`` (fields the server adds are ignored)."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return True
        return any(needs_apply(v, live.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return True
        return any(needs_apply(d, lv) for d, lv in zip(desired, live, strict=True))
    return bool(desired != live)


def reconcile(kube: Kube, config: OperatorConfig, namespace: str, name: str) -> None:
    """Converges one TFDataService; safe to call at any time from any thread."""
    with _lock_for(namespace, name):
        body = kube.get(API_VERSION, KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return  # ownerReferences let the garbage collector remove the children
        _reconcile_locked(kube, config, body)


def _reconcile_locked(kube: Kube, config: OperatorConfig, body: Manifest) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    children = observe(kube, namespace, name, meta["uid"])
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    observed = status.Observed(dispatcher=children.dispatcher, workers=children.workers)

    try:
        svc = spec.parse(body, config.server_image)
    except spec.SpecError as exc:
        _report_invalid(kube, config, body, None, observed, now, f"Invalid spec: {exc}")
        return
    if children.foreign:
        taken = ", ".join(f"{kind} {child}" for kind, child in children.foreign)
        message = (
            f"{taken} already exist(s) in namespace {namespace} and do(es) not belong to this TFDataService; "
            "nothing was changed. Delete or rename them, or give this TFDataService another name."
        )
        _report_invalid(kube, config, body, svc, observed, now, message, reason=status.NAME_CONFLICT)
        return

    desired = desired_children(svc, config.build, children)
    live = dict(children.objects)
    changed = [m for m in desired.apply if needs_apply(m, live.get(_key(m)))]

    # Dry-run every change first: if the API server refuses any of them (a pod template it rejects,
    # say), nothing is changed at all and the user is told why.
    for manifest in changed:
        try:
            kube.apply(manifest, dry_run=True)
        except ApiException as exc:
            if exc.status in (400, 422):
                if _is_immutable_statefulset_change(manifest, exc):
                    _recreate(kube, body, manifest, live)
                    return
                message = f"The API server rejected the {manifest['kind']} {manifest['metadata']['name']}: "
                _report_invalid(kube, config, body, svc, observed, now, message + describe_api_error(exc))
                return
            raise

    for manifest in changed:
        existed = _key(manifest) in live
        live[_key(manifest)] = kube.apply(manifest)
        verb = "Updated" if existed else "Created"
        log.info("%s %s %s/%s", verb, manifest["kind"], namespace, manifest["metadata"]["name"])
        if not existed:
            kube.event(body, "Normal", verb, f"{verb} {manifest['kind']} {manifest['metadata']['name']}")
    for sts in (
        live.get(("StatefulSet", builders.dispatcher_name(svc))),
        live.get(("StatefulSet", builders.workers_name(svc))),
    ):
        for pod in scaling.stuck_pods(sts, children.pods):
            meta_pod = pod["metadata"]
            if kube.delete("v1", "Pod", namespace, meta_pod["name"], uid=meta_pod.get("uid")):
                message = f"Deleted pod {meta_pod['name']}: it is not ready and runs an old configuration"
                log.info(message)
                kube.event(body, "Normal", "RestartedStuckPod", message)
    for pod in scaling.stale_workers(svc, children.pods_of(builders.DISPATCHER), children.pods_of(builders.WORKER)):
        meta_pod = pod["metadata"]
        if kube.delete("v1", "Pod", namespace, meta_pod["name"], uid=meta_pod.get("uid")):
            message = (
                f"Deleted pod {meta_pod['name']}: it registered with an earlier dispatcher pod, and without "
                "faultTolerantMode the new dispatcher hands out task ids the worker still holds"
            )
            log.info(message)
            kube.event(body, "Normal", "RestartedStaleWorker", message)
    for api_version, kind, child in desired.delete:
        if kube.delete(api_version, kind, namespace, child):
            log.info("Deleted %s %s/%s", kind, namespace, child)
            kube.event(body, "Normal", "Deleted", f"Deleted {kind} {child}")

    observed = status.Observed(
        dispatcher=live.get(("StatefulSet", builders.dispatcher_name(svc))),
        workers=live.get(("StatefulSet", builders.workers_name(svc))),
    )
    new_status = status.compute_status(svc, body, observed, config.build, now, waiting=desired.waiting)
    _write_status(kube, body, new_status)


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences") or [])


def _is_immutable_statefulset_change(manifest: Manifest, exc: ApiException) -> bool:
    return manifest["kind"] == "StatefulSet" and "updates to statefulset spec for fields other than" in (
        describe_api_error(exc)
    )


def _recreate(kube: Kube, body: Manifest, manifest: Manifest, live: dict[tuple[str, str], Manifest]) -> None:
    """A StatefulSet field that cannot be updated changed: delete it; the next reconcile creates it anew."""
    name = manifest["metadata"]["name"]
    current = live.get(("StatefulSet", name))
    uid = current["metadata"]["uid"] if current else None
    if kube.delete("apps/v1", "StatefulSet", manifest["metadata"]["namespace"], name, uid=uid):
        message = f"Recreating StatefulSet {name}: a field Kubernetes cannot update in place changed"
        log.info(message)
        kube.event(body, "Normal", "Recreating", message)


def _report_invalid(
    kube: Kube,
    config: OperatorConfig,
    body: Manifest,
    svc: spec.ServiceSpec | None,
    observed: status.Observed,
    now: str,
    message: str,
    reason: str = status.INVALID_SPEC,
) -> None:
    new_status = status.compute_status(svc, body, observed, config.build, now, invalid=message, reason=reason)
    old_ready: Mapping[str, Any] = next(
        (c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    if old_ready.get("reason") != reason or old_ready.get("message") != message:
        log.warning("%s/%s: %s", body["metadata"]["namespace"], body["metadata"]["name"], message)
        kube.event(body, "Warning", reason, message)
    _write_status(kube, body, new_status)


def _write_status(kube: Kube, body: Manifest, new_status: Manifest) -> None:
    if not status.status_differs(body.get("status"), new_status):
        return
    meta = body["metadata"]
    try:
        kube.patch_status(API_VERSION, KIND, meta["namespace"], meta["name"], new_status)
    except ApiException as exc:
        if exc.status != 404:  # deleted meanwhile: nothing left to report on
            raise
