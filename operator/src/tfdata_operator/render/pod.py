"""The pod template the dispatcher's and the workers' StatefulSets share: the server
container, its injected program, probes, security context and volumes, and the user's
spec.<component> pod settings on top.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfdata_operator.api.identity import CONFIG_HASH_ANNOTATION
from tfdata_operator.api.spec import (
    PROGRAM_VOLUME,
    SNAPSHOTS_VOLUME,
    TMP_MOUNT,
    TMP_VOLUME,
    PodSettings,
    ServiceSpec,
    default_requests,
)
from tfdata_operator.render.names import WORKER, labels, selector_labels
from tfdata_operator.render.podconfig import config_hash
from tfdata_operator.render.settings import BuildSettings, Manifest
from tfdata_operator.wire import serverconfig

# What an image of the user's may lack that the server program needs in its environment: a
# writable home (Keras writes ~/.keras) under the read-only root, and logs as they come. Defaults
# only: a variable of the same name in spec.<component>.env replaces the operator's.
INJECTED_ENV = (("HOME", TMP_MOUNT), ("KERAS_HOME", f"{TMP_MOUNT}/.keras"), ("PYTHONUNBUFFERED", "1"))
SERVER_UID = 1000


def pod_template(
    svc: ServiceSpec,
    settings: BuildSettings,
    component: str,
    pod: PodSettings,
    config_json: str,
    ports: dict[str, int],
    health_port: int,
    mounts: list[dict[str, Any]],
) -> Manifest:
    """The template of a server's pod: ``config_json`` is its server configuration (``podconfig``),
    ``mounts`` the operator's volume mounts of this component (the dispatcher's journal)."""
    container = _container(svc, component, pod, config_json, ports, health_port, mounts)
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # Without a service account of the user's choosing the servers need no API access at all.
        "automountServiceAccountToken": pod.service_account_name is not None,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SERVER_UID,
            "runAsGroup": SERVER_UID,
            "fsGroup": SERVER_UID,
            # A volume's ownership is changed only when its root is not the pod's group already: not a
            # recursive chown and chmod of every file (a data claim of millions of TFRecords) at each start.
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": 30,
        # Bounded: a pipeline caching to /tmp gets its own pod evicted, never fills the node's disk.
        "volumes": [{"name": TMP_VOLUME, "emptyDir": {"sizeLimit": pod.tmp_size_limit}}, *_as_stored(pod.volumes)],
    }
    if svc.snapshots is not None and svc.snapshots.claim_name is not None:
        # Every server writes (workers: the chunks) or reads (the dispatcher: the progress) the snapshots.
        container["volumeMounts"].append({"name": SNAPSHOTS_VOLUME, "mountPath": svc.snapshots.directory.rstrip("/")})
        claim = {"claimName": svc.snapshots.claim_name}
        pod_spec["volumes"].append({"name": SNAPSHOTS_VOLUME, "persistentVolumeClaim": claim})
    if svc.inject_server:
        container["volumeMounts"].append(_program_mount(read_only=True))
        pod_spec["initContainers"] = [_injector(settings)]
        pod_spec["volumes"].append({"name": PROGRAM_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}})
    pod_spec.update(_optional(svc, component, pod))
    return {
        "metadata": {
            "labels": {**pod.labels, **labels(svc, component)},
            "annotations": {**pod.annotations, CONFIG_HASH_ANNOTATION: config_hash(config_json)},
        },
        "spec": pod_spec,
    }


def _container(
    svc: ServiceSpec,
    component: str,
    pod: PodSettings,
    config_json: str,
    ports: dict[str, int],
    health_port: int,
    mounts: list[dict[str, Any]],
) -> dict[str, Any]:
    """The server's container: the program, its configuration and variables, ports, probes and mounts."""
    users = {e["name"] for e in pod.env}
    defaults = [(k, v) for k, v in (INJECTED_ENV if svc.inject_server else ()) if k not in users]
    container: dict[str, Any] = {
        "name": component,
        "image": svc.image,
        "command": ["python3", serverconfig.INJECTED_PROGRAM] if svc.inject_server else ["tfdata-server"],
        "args": [component],
        "env": [
            *({"name": k, "value": v} for k, v in defaults),
            {"name": serverconfig.POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": serverconfig.POD_NAMESPACE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": serverconfig.CONFIG_ENV, "value": config_json},
            # The user's after the operator's: spec refuses the operator's own names (RESERVED_ENV), and
            # a user's variable named like a default replaces it (a name twice is refused by the API server).
            *_as_stored(pod.env),
        ],
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports.items()]
        + [{"name": "health", "containerPort": health_port, "protocol": "TCP"}],
        # A dispatcher replaying a long journal is alive (healthz) long before it is ready.
        "startupProbe": _probe("/healthz", period=2, failures=150),
        "livenessProbe": _probe("/healthz", period=10, failures=6),
        "readinessProbe": _probe("/readyz", period=2, failures=3),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": TMP_VOLUME, "mountPath": TMP_MOUNT}, *mounts, *_as_stored(pod.volume_mounts)],
        # A server that exits at start (an image that cannot serve, say) explains why in its last
        # log line, which becomes the container's termination message and so the conditions' text.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if pod.env_from:
        # Explicit env wins over envFrom, so a key named like the operator's variables changes nothing.
        container["envFrom"] = _as_stored(pod.env_from)
    if svc.image_pull_policy:
        container["imagePullPolicy"] = svc.image_pull_policy
    container["resources"] = default_requests(pod, component)
    return container


def _optional(svc: ServiceSpec, component: str, pod: PodSettings) -> dict[str, Any]:
    """The pod's fields the user may set (spec.<component>, spec.imagePullSecrets), where set."""
    optional = {
        "serviceAccountName": pod.service_account_name,
        "priorityClassName": pod.priority_class_name,
        "nodeSelector": dict(pod.node_selector) or None,
        "tolerations": [dict(t) for t in pod.tolerations] or None,
        "affinity": _affinity(svc, component, pod) or None,
        "topologySpreadConstraints": [dict(c) for c in pod.topology_spread_constraints or ()] or None,
        "imagePullSecrets": [{"name": s} for s in svc.image_pull_secrets] or None,
    }
    return {k: v for k, v in optional.items() if v is not None}


def _program_mount(read_only: bool) -> dict[str, Any]:
    return {"name": PROGRAM_VOLUME, "mountPath": serverconfig.INJECT_MOUNT, "readOnly": read_only}


def _injector(settings: BuildSettings) -> dict[str, Any]:
    """The init container that copies the server program into the pod (spec.serverProgram Injected)."""
    return {
        "name": "inject-server-program",
        "image": settings.injector_image,
        "command": ["python3", "-m", serverconfig.INJECT_MODULE, serverconfig.INJECT_MOUNT],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [_program_mount(read_only=False)],
    }


def _as_stored(items: tuple[Mapping[str, Any], ...]) -> list[dict[str, Any]]:
    """The user's volumes, mounts or variables without their false and empty-string fields.

    The API server drops such a field unless Go holds it in a pointer (``readOnly: false``,
    ``value: ""``), and in these types false or empty always means the same as unset: without
    them the template stays a subset of what is stored, so a reconcile finds nothing to change."""
    return [_without_zero_values(item) for item in items]


def _without_zero_values(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_zero_values(v) for k, v in value.items() if v is not False and v != ""}
    if isinstance(value, list):
        return [_without_zero_values(v) for v in value]
    return value


def _affinity(svc: ServiceSpec, component: str, pod: PodSettings) -> dict[str, Any]:
    """The user's affinity; workers without their own podAntiAffinity or topologySpreadConstraints
    prefer nodes that run no other worker of the service, so one node going away takes few."""
    affinity = dict(pod.affinity or {})
    if component == WORKER and "podAntiAffinity" not in affinity and pod.topology_spread_constraints is None:
        term = {"labelSelector": {"matchLabels": selector_labels(svc, WORKER)}, "topologyKey": "kubernetes.io/hostname"}
        affinity["podAntiAffinity"] = {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]
        }
    return affinity


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "health"},
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }
