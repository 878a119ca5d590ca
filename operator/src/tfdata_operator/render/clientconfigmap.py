"""The client ConfigMap (``<name>-client``): what a trainer needs to read from the service."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfdata_operator.api.spec import ServiceSpec
from tfdata_operator.render.names import client_configmap_name, dispatcher_address, dispatcher_health_url, metadata
from tfdata_operator.render.settings import BuildSettings, Manifest
from tfdata_operator.wire import discovery, serverinfo, signals, snapshots


def client_settings(
    svc: ServiceSpec, settings: BuildSettings, server: Mapping[str, Any] | None = None
) -> discovery.ClientSettings:
    """What a trainer needs to read from this service (see ``discovery``); ``server`` is what the
    servers reported (status.server), when they have."""
    server = server or {}
    graph_def = server.get("graphDefVersion")
    # The report goes to the dispatcher pod's health port through the dispatcher Service.
    report_url = dispatcher_health_url(svc, settings, signals.REPORT_PATH)
    return discovery.ClientSettings(
        address=dispatcher_address(svc, settings),
        sharding_policy=svc.sharding_policy,
        processing_mode=discovery.processing_mode_for(svc.sharding_policy),
        service_name=svc.name,
        namespace=svc.namespace,
        data_transfer_protocol=svc.workers.data_transfer_protocol,
        report_url=report_url,
        server_info_url=dispatcher_health_url(svc, settings, serverinfo.INFO_PATH),
        server_tensorflow=server.get("tensorflowVersion") or None,
        server_graph_def_version=str(graph_def) if graph_def is not None else None,
        server_preloaded_ops=",".join(server.get("preloadedOps") or ()) or None,
        snapshot_dir=svc.snapshots.directory if svc.snapshots else None,
        snapshots_url=dispatcher_health_url(svc, settings, snapshots.SNAPSHOTS_PATH) if svc.snapshots else None,
    )


def build_client_configmap(
    svc: ServiceSpec, settings: BuildSettings, server: Mapping[str, Any] | None = None
) -> Manifest:
    """The ConfigMap trainers take with ``envFrom`` or mount: no Kubernetes credentials needed."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(svc, client_configmap_name(svc), "client"),
        "data": discovery.to_data(client_settings(svc, settings, server)),
    }
