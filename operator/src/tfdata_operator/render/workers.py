"""The workers' StatefulSet: as many pods as the scaling plan decides, started and stopped together."""

from __future__ import annotations

from tfdata_operator.api.spec import ServiceSpec
from tfdata_operator.render.names import WORKER, metadata, selector_labels, worker_ports, workers_name
from tfdata_operator.render.pod import pod_template
from tfdata_operator.render.podconfig import worker_config
from tfdata_operator.render.settings import BuildSettings, Manifest
from tfdata_operator.wire import serverconfig


def build_worker_statefulset(svc: ServiceSpec, settings: BuildSettings, replicas: int) -> Manifest:
    """The workers; ``replicas`` is decided by the scaling plan, not always the spec's count."""
    w = svc.workers
    ports = worker_ports(svc)
    config_json = serverconfig.to_json(worker_config(svc, settings))
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(svc, workers_name(svc), WORKER),
        "spec": {
            "replicas": replicas,
            "serviceName": workers_name(svc),
            # Workers are independent: start and stop them together, not one by one.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector_labels(svc, WORKER)},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": pod_template(svc, settings, WORKER, w.pod, config_json, ports, w.health_port, []),
        },
    }
