"""The Services: the dispatcher's address, its pod's DNS name, and every worker's DNS name."""

from __future__ import annotations

from typing import Any

from tfdata_operator.api.spec import ServiceSpec
from tfdata_operator.render.names import (
    DISPATCHER,
    WORKER,
    dispatcher_name,
    dispatcher_pods_name,
    metadata,
    selector_labels,
    worker_ports,
    workers_name,
)
from tfdata_operator.render.settings import Manifest


def _service(svc: ServiceSpec, name: str, component: str, ports: dict[str, int], headless: bool) -> Manifest:
    spec: dict[str, Any] = {"clusterIP": "None"} if headless else {"type": "ClusterIP"}
    spec.update(
        {
            # Addresses resolve before the pods are ready: a static dispatcher is ready only once every
            # listed worker registered, and clients and the dispatcher reach workers while they register.
            "publishNotReadyAddresses": True,
            "selector": selector_labels(svc, component),
            "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in ports.items()],
        }
    )
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(svc, name, component), "spec": spec}


def build_dispatcher_service(svc: ServiceSpec) -> Manifest:
    """The ClusterIP Service trainers and workers connect to (status.dispatcherAddress): its
    address stays the same when the dispatcher pod is replaced. Its health port also takes the
    trainers' data-stall reports (``signals.REPORT_PATH``) and serves ``/v1/signals``."""
    ports = {"grpc": svc.dispatcher.port, "health": svc.dispatcher.health_port}
    return _service(svc, dispatcher_name(svc), DISPATCHER, ports, headless=False)


def build_dispatcher_pods_service(svc: ServiceSpec) -> Manifest:
    """The headless Service that governs the dispatcher's StatefulSet (a StatefulSet's serviceName
    must name a headless Service): it gives the dispatcher pod its stable DNS name."""
    return _service(svc, dispatcher_pods_name(svc), DISPATCHER, {"grpc": svc.dispatcher.port}, headless=True)


def build_worker_service(svc: ServiceSpec) -> Manifest:
    """The headless Service that gives every worker its stable DNS name."""
    return _service(svc, workers_name(svc), WORKER, worker_ports(svc), headless=True)
