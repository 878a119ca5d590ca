"""The names, addresses, ports and labels every child of a TFDataService shares.

A child's name, the dispatcher's and the workers' DNS names, the ports the Services expose,
the labels that select the pods, and the metadata (with its ownerReference) of every child.
"""

from __future__ import annotations

from typing import Any

from tfdata_operator.api.identity import (
    API_VERSION,
    COMPONENT_LABEL,
    INSTANCE_LABEL,
    KIND,
    MANAGED_BY_LABEL,
    MANAGER,
    NAME_LABEL,
)
from tfdata_operator.api.spec import ServiceSpec
from tfdata_operator.render.settings import BuildSettings
from tfdata_operator.wire import serverconfig

DISPATCHER = "dispatcher"
WORKER = "worker"


# --- Names and addresses -------------------------------------------------------------


def _name(svc: ServiceSpec | str) -> str:
    return svc if isinstance(svc, str) else svc.name


def dispatcher_name(svc: ServiceSpec | str) -> str:
    return f"{_name(svc)}-dispatcher"


def dispatcher_pods_name(svc: ServiceSpec | str) -> str:
    """The headless Service that governs the dispatcher's StatefulSet (its pod's DNS name)."""
    return f"{_name(svc)}-dispatcher-pods"


def workers_name(svc: ServiceSpec | str) -> str:
    return f"{_name(svc)}-worker"


def network_policy_name(svc: ServiceSpec | str) -> str:
    return _name(svc)


def client_configmap_name(svc: ServiceSpec | str) -> str:
    return f"{_name(svc)}-client"


def dispatcher_host(svc: ServiceSpec, settings: BuildSettings) -> str:
    return f"{dispatcher_name(svc)}.{svc.namespace}.svc.{settings.cluster_domain}"


def dispatcher_address(svc: ServiceSpec, settings: BuildSettings) -> str:
    """What trainers pass to ``distribute(service=...)``."""
    return f"grpc://{dispatcher_host(svc, settings)}:{svc.dispatcher.port}"


def dispatcher_health_url(svc: ServiceSpec, settings: BuildSettings, path: str) -> str:
    """A path on the dispatcher pod's health port, through the dispatcher Service (which exposes it)."""
    return f"http://{dispatcher_host(svc, settings)}:{svc.dispatcher.health_port}{path}"


def worker_address_format(svc: ServiceSpec, settings: BuildSettings, port: int | str) -> str:
    """A worker's stable DNS name behind the headless Service, with the pod name left open."""
    host = f"{serverconfig.POD_NAME_PLACEHOLDER}.{workers_name(svc)}.{svc.namespace}.svc.{settings.cluster_domain}"
    return f"{host}:{port}"


def worker_addresses(svc: ServiceSpec, settings: BuildSettings, count: int) -> list[str]:
    """The static worker list: exactly what workers 0..count-1 announce."""
    fmt = worker_address_format(svc, settings, svc.workers.port)
    return [serverconfig.worker_address(fmt, f"{workers_name(svc)}-{i}") for i in range(count)]


def worker_ports(svc: ServiceSpec) -> dict[str, int]:
    """The workers' named ports: the worker Service's and the worker container's."""
    ports = {"grpc": svc.workers.port}
    if svc.workers.data_transfer_port is not None:
        ports["data-transfer"] = svc.workers.data_transfer_port
    return ports


# --- Labels and ownership ------------------------------------------------------------


def instance_labels(svc: ServiceSpec | str) -> dict[str, str]:
    """Every pod of the service, dispatcher and workers."""
    return {NAME_LABEL: "tfdata-service", INSTANCE_LABEL: _name(svc)}


def selector_labels(svc: ServiceSpec | str, component: str) -> dict[str, str]:
    return {**instance_labels(svc), COMPONENT_LABEL: component}


MANAGED_BY = {MANAGED_BY_LABEL: MANAGER}


def labels(svc: ServiceSpec, component: str) -> dict[str, str]:
    return {**selector_labels(svc, component), **MANAGED_BY}


def worker_selector(svc: ServiceSpec) -> str:
    """The label selector of the worker pods, as the scale subresource reports it."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(svc, WORKER).items()))


def owner_reference(svc: ServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": svc.name,
        "uid": svc.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(svc: ServiceSpec, name: str, component: str) -> dict[str, Any]:
    """A child's metadata: its name, the service's namespace, its labels, owned by the service."""
    return {
        "name": name,
        "namespace": svc.namespace,
        "labels": labels(svc, component),
        "ownerReferences": [owner_reference(svc)],
    }
