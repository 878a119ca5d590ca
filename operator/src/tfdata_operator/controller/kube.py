"""A small typed door to the Kubernetes API for the kinds the operator reads and writes.

Built on the official client's ApiClient (auth, TLS, retries of connections) with
server-side apply for children, so a repeated apply of the same manifest is a no-op
that leaves resourceVersion alone, and fields the operator stopped setting are removed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timezone
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from tfdata_operator import __version__
from tfdata_operator.api import limits
from tfdata_operator.api.identity import API_VERSION, KIND, MANAGER
from tfdata_operator.controller import cache, metrics
from tfdata_operator.plan import admission
from tfdata_operator.plan.children import path

log = logging.getLogger(__name__)
Manifest = dict[str, Any]


def load_client_config() -> kubernetes.client.ApiClient:
    """In-cluster credentials inside a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    configuration = kubernetes.client.Configuration.get_default_copy()
    # Reconciles send their independent requests at once: keep the connections for them.
    configuration.connection_pool_maxsize = 32
    client = kubernetes.client.ApiClient(configuration)
    # The API server's audit log and metrics name the operator by this.
    client.user_agent = f"{MANAGER}/{__version__}"
    return client


def describe_api_error(exc: ApiException) -> str:
    """The API server's own message (it says what is wrong), not the HTTP wrapper."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    return str(body.get("message") or exc.reason or exc)


def admission_denial(exc: object) -> admission.Denial | None:
    """Whether another admission controller of the cluster (a webhook, a ValidatingAdmissionPolicy)
    refused the request, and which: read from the API server's ``Status`` (``plan.admission``)."""
    answer = _status_answer(exc)
    return admission.denial(*answer) if answer else None


def quota_refusal(exc: object) -> admission.Denial | None:
    """Whether a ResourceQuota of the namespace has no room for what the request creates, and which
    (``plan.admission.quota``)."""
    answer = _status_answer(exc)
    return admission.quota(*answer) if answer else None


def _status_answer(exc: object) -> tuple[int, dict[str, Any] | None] | None:
    """The API server's code and its ``Status`` (None when the body is not a JSON object), or None
    when ``exc`` is no answer of it."""
    if not isinstance(exc, ApiException) or exc.status is None:
        return None
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return None
    return int(exc.status), body if isinstance(body, dict) else None


def namespace_terminating(exc: BaseException) -> bool:
    """Whether the API server refused a write because the namespace is being deleted (403 with the cause
    NamespaceTerminating): the namespace's objects, the TFDataService included, are going anyway."""
    if not isinstance(exc, ApiException) or exc.status != 403:
        return False
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return False
    causes = ((body.get("details") or {}).get("causes") or []) if isinstance(body, dict) else []
    return any(isinstance(c, dict) and c.get("reason") == "NamespaceTerminating" for c in causes)


# As many as client-go's EventCorrelator keeps: an Event said again after more than this many
# others is a new one (still correct, only not counted with the first).
MAX_REMEMBERED_EVENTS = 4096

_VERBS = {"GET": "get", "PATCH": "patch", "POST": "create", "DELETE": "delete", "PUT": "update"}


class Kube:
    """``guard`` wraps every request (the leader election's check that this process still leads);
    ``counted`` says whether requests count in ``tfdata_operator_api_requests_total``."""

    def __init__(
        self,
        api: kubernetes.client.ApiClient,
        guard: Callable[[], AbstractContextManager[None]] = nullcontext,
        counted: bool = True,
    ) -> None:
        self.api, self.guard, self.counted = api, guard, counted
        # The Events recorded last, by what makes one the same as another: (name, count).
        self.recorded: cache.Latest[tuple[str, int]] = cache.Latest(MAX_REMEMBERED_EVENTS)

    def call(
        self,
        method: str,
        url: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> Manifest:
        if body is not None and "json" not in content_type:
            body = json.dumps(body)  # JSON is YAML: what apply-patch+yaml needs, already serialised
        method, full_url, headers, payload, _ = self.api.param_serialize(
            method,
            url,
            query_params=query or [],
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        with self.guard():
            response = self.api.call_api(
                method, full_url, header_params=headers, body=payload, _request_timeout=timeout
            )
            data = response.read()
        if self.counted:
            metrics.API_REQUESTS.labels(_VERBS.get(method, method), str(response.status)).inc()
        if not 200 <= response.status < 300:
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
            raise ApiException(status=response.status, reason=response.reason, body=text)
        return json.loads(data) if data else {}

    def find(self, api_version: str, kind: str, namespace: str, name: str) -> Manifest | None:
        """The object of that name, if any: a list filtered by name, which the watches' list permission covers."""
        query = [("fieldSelector", f"metadata.name={name}")]
        items: list[Manifest] = self.call("GET", path(api_version, kind, namespace), query=query).get("items", [])
        return items[0] if items else None

    def list_objects(self, api_version: str, kind: str, namespace: str) -> list[Manifest]:
        """Every object of a kind in a namespace: one request, for what the watches' cache cannot
        settle alone (that it holds every one of them)."""
        items: list[Manifest] = self.call("GET", path(api_version, kind, namespace)).get("items", [])
        return items

    def apply(self, manifest: Manifest, dry_run: bool = False) -> Manifest:
        """Server-side apply as the operator's field manager, taking over conflicting fields."""
        meta = manifest["metadata"]
        query = [("fieldManager", MANAGER), ("force", "true")]
        if dry_run:
            query.append(("dryRun", "All"))
        return self.call(
            "PATCH",
            path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"]),
            body=manifest,
            query=query,
            content_type="application/apply-patch+yaml",
        )

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Manifest | None:
        """One object by name (None: it does not exist), for the few kinds the watches do not cover."""
        try:
            return self.call("GET", path(api_version, kind, namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def delete(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        uid: str | None = None,
        grace_period_seconds: int | None = None,
    ) -> bool:
        """Deletes in the background; ``uid`` guards against deleting a newer object of that name;
        ``grace_period_seconds`` 0 removes a pod at once, without waiting for its kubelet (a force delete)."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        try:
            self.call("DELETE", path(api_version, kind, namespace, name), body=body)
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    def patch_status(self, api_version: str, kind: str, namespace: str, name: str, status: Manifest) -> Manifest:
        return self.call(
            "PATCH",
            path(api_version, kind, namespace, name, "status"),
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    def patch(self, api_version: str, kind: str, namespace: str, name: str, patch: Manifest) -> Manifest:
        """A JSON merge patch of the object itself (a TFDataSnapshot's finalizers, with its
        resourceVersion: refused with 409 if the object changed since it was read)."""
        return self.call(
            "PATCH",
            path(api_version, kind, namespace, name),
            body=patch,
            content_type="application/merge-patch+json",
        )

    def patch_subresource(
        self, api_version: str, kind: str, namespace: str, name: str, subresource: str, patch: Manifest
    ) -> Manifest:
        """A JSON merge patch of a subresource (a Kueue Workload's status, with its resourceVersion:
        refused with 409 if the object changed since it was read)."""
        return self.call(
            "PATCH",
            path(api_version, kind, namespace, name, subresource),
            body=patch,
            content_type="application/merge-patch+json",
        )

    def scale(self, namespace: str, name: str, replicas: int) -> Manifest:
        """Sets a TFDataService's worker count through its scale subresource (what `kubectl scale` does)."""
        return self.call(
            "PATCH",
            path(API_VERSION, KIND, namespace, name, "scale"),
            body={"spec": {"replicas": replicas}},
            content_type="application/merge-patch+json",
        )

    def retain(self, volume: str) -> Manifest:
        """Sets a PersistentVolume's reclaim policy to Retain (spec.nodeLoss: a lost dispatcher's journal,
        before its claim is let go), so that deleting the claim never deletes the data."""
        return self.call(
            "PATCH",
            path("v1", "PersistentVolume", None, volume),
            body={"spec": {"persistentVolumeReclaimPolicy": "Retain"}},
            content_type="application/merge-patch+json",
        )

    def list_events(self, namespace: str, kind: str) -> list[Manifest]:
        """The Warning Events about objects of one kind in a namespace, filtered by the API server
        (read only while a service is not ready, to say why: ``diagnose.py``).

        The whole namespace's, not one object's: the API server keeps no watch cache of Events, so
        every list of them reads all the namespace's Events from etcd and filters afterwards (at
        1,220 ``make bench`` services, 11,361 Events, 8 MB, for each claim's handful). One list per
        kind serves every unready service of the namespace."""
        query = [("fieldSelector", f"involvedObject.kind={kind},type=Warning")]
        items: list[Manifest] = self.call("GET", path("v1", "Event", namespace), query=query).get("items", [])
        return items

    def event(self, owner: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        """Records an Event on ``owner``; failing to record one never fails a reconcile.

        The same Event again (same object, type, reason and message) adds one to the last one's
        ``count`` and moves its ``lastTimestamp``, as client-go's EventCorrelator does: a refusal
        or a failed read said at every resync is one line in `kubectl describe`, not one object in
        etcd each time. An Event the API server dropped since (after its TTL, an hour by default),
        or one the operator may not patch, is created again."""
        meta = owner["metadata"]
        message = limits.clip(message, limits.EVENT_MESSAGE)
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        key = (meta.get("uid"), owner.get("kind"), meta["namespace"], meta["name"], event_type, reason, message)
        try:
            if (seen := self.recorded.get(key)) is not None and self._counted_again(meta["namespace"], *seen, now):
                self.recorded.put(key, (seen[0], seen[1] + 1))
                return
            body = _event(owner, event_type, reason, message, now)
            created = self.call("POST", path("v1", "Event", meta["namespace"]), body=body)
            self.recorded.put(key, (created["metadata"]["name"], 1))
        except ApiException as exc:
            log.warning("Could not record event %s on %s: %s", reason, meta["name"], describe_api_error(exc))

    def _counted_again(self, namespace: str, name: str, count: int, now: str) -> bool:
        """Whether the Event ``name``, seen ``count`` times, now says one more (False: it is gone)."""
        try:
            self.call(
                "PATCH",
                path("v1", "Event", namespace, name),
                body={"count": count + 1, "lastTimestamp": now},
                content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            # 404: dropped after its TTL. 403: a role from before Events were counted (no patch).
            if exc.status not in (403, 404):
                raise
            return False
        return True


def _event(owner: Mapping[str, Any], event_type: str, reason: str, message: str, now: str) -> Manifest:
    meta = owner["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": owner.get("apiVersion"),
            "kind": owner.get("kind"),
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "type": event_type,
        "reason": reason,
        "message": message,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "source": {"component": MANAGER},
        "reportingComponent": MANAGER,
    }
