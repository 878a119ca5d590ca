"""The render function of each row of ``plan.children.CHILDREN``, and the names callers use.

A ServiceSpec in, the manifests of the TFDataService's children out; no I/O and no Kubernetes
client. Each child kind is built in its own module, and this one gathers them, so
``tfdata-operator render`` and the running operator produce the same objects:

- ``names``: names, addresses, ports, labels and metadata every child shares;
- ``settings``: ``BuildSettings`` (operator-wide) and ``Counts`` (what the plan decided);
- ``podconfig``: the server configuration written into the pods, and read back from them;
- ``journal``: where the dispatcher journals, and its claim;
- ``pod``: the pod template both StatefulSets share;
- ``dispatcher``, ``workers``: the two StatefulSets;
- ``services``, ``clientconfigmap``, ``hpa``, ``disruptionbudget``, ``networkpolicy``: the rest;
- ``workload``: the Kueue Workload of a queued service (not a row of the table: ``plan/kueue.py``).
"""

from __future__ import annotations

from tfdata_operator.api.spec import JOURNAL_MOUNT, JOURNAL_VOLUME, PROGRAM_VOLUME, ServiceSpec
from tfdata_operator.render.clientconfigmap import build_client_configmap, client_settings
from tfdata_operator.render.dispatcher import build_dispatcher_statefulset
from tfdata_operator.render.disruptionbudget import build_worker_pdb
from tfdata_operator.render.hpa import build_hpa
from tfdata_operator.render.journal import DEFAULT_WORK_DIR, journal_base, static_journal
from tfdata_operator.render.names import (
    DISPATCHER,
    MANAGED_BY,
    WORKER,
    client_configmap_name,
    dispatcher_address,
    dispatcher_health_url,
    dispatcher_host,
    dispatcher_name,
    dispatcher_pods_name,
    instance_labels,
    labels,
    network_policy_name,
    owner_reference,
    selector_labels,
    worker_address_format,
    worker_addresses,
    worker_selector,
    workers_name,
)
from tfdata_operator.render.networkpolicy import build_network_policy, egress_peers, operator_peer, reads_signals
from tfdata_operator.render.pod import INJECTED_ENV, SERVER_UID
from tfdata_operator.render.podconfig import (
    STATIC_HEARTBEAT_MS,
    config_hash,
    cpu_given_millicores,
    dispatcher_config,
    read_config,
    worker_config,
)
from tfdata_operator.render.services import (
    build_dispatcher_pods_service,
    build_dispatcher_service,
    build_worker_service,
)
from tfdata_operator.render.settings import DEFAULT_INJECTOR_IMAGE, BuildSettings, Counts, Manifest, Named
from tfdata_operator.render.workers import build_worker_statefulset
from tfdata_operator.render.workload import build_workload, worker_counts, workload_name

__all__ = [
    "DEFAULT_INJECTOR_IMAGE",
    "DEFAULT_WORK_DIR",
    "DISPATCHER",
    "INJECTED_ENV",
    "JOURNAL_MOUNT",
    "JOURNAL_VOLUME",
    "MANAGED_BY",
    "PROGRAM_VOLUME",
    "SERVER_UID",
    "STATIC_HEARTBEAT_MS",
    "WORKER",
    "BuildSettings",
    "Counts",
    "Manifest",
    "Named",
    "build_client_configmap",
    "build_dispatcher_pods_service",
    "build_dispatcher_service",
    "build_dispatcher_statefulset",
    "build_hpa",
    "build_network_policy",
    "build_worker_pdb",
    "build_worker_service",
    "build_worker_statefulset",
    "build_workload",
    "client_configmap_name",
    "client_settings",
    "config_hash",
    "cpu_given_millicores",
    "dispatcher_address",
    "dispatcher_config",
    "dispatcher_health_url",
    "dispatcher_host",
    "dispatcher_name",
    "dispatcher_pods_name",
    "egress_peers",
    "instance_labels",
    "journal_base",
    "labels",
    "network_policy_name",
    "operator_peer",
    "owner_reference",
    "read_config",
    "reads_signals",
    "render_configmaps",
    "render_hpas",
    "render_network_policies",
    "render_pdbs",
    "render_services",
    "render_statefulsets",
    "render_workload",
    "selector_labels",
    "static_journal",
    "worker_address_format",
    "worker_addresses",
    "worker_config",
    "worker_selector",
    "workers_name",
    "workload_name",
]


# --- One render function per child kind (the rows of ``plan.children.CHILDREN``) -------------


def render_services(svc: ServiceSpec, settings: BuildSettings, counts: Counts) -> list[Named]:
    return [
        (dispatcher_name(svc), build_dispatcher_service(svc)),
        (dispatcher_pods_name(svc), build_dispatcher_pods_service(svc)),
        (workers_name(svc), build_worker_service(svc)),
    ]


def render_configmaps(svc: ServiceSpec, settings: BuildSettings, counts: Counts) -> list[Named]:
    return [(client_configmap_name(svc), build_client_configmap(svc, settings, counts.server))]


def render_statefulsets(svc: ServiceSpec, settings: BuildSettings, counts: Counts) -> list[Named]:
    dispatcher = build_dispatcher_statefulset(svc, settings, counts.dispatcher_workers, counts.journal)
    return [
        (dispatcher_name(svc), dispatcher),
        (workers_name(svc), build_worker_statefulset(svc, settings, counts.worker_replicas)),
    ]


def render_hpas(svc: ServiceSpec, settings: BuildSettings, counts: Counts) -> list[Named]:
    return [(workers_name(svc), build_hpa(svc))]


def render_pdbs(svc: ServiceSpec, settings: BuildSettings, counts: Counts) -> list[Named]:
    return [(workers_name(svc), build_worker_pdb(svc, counts.max_unavailable))]


def render_network_policies(svc: ServiceSpec, settings: BuildSettings, counts: Counts) -> list[Named]:
    return [(network_policy_name(svc), build_network_policy(svc, settings))]


def render_workload(svc: ServiceSpec, settings: BuildSettings, priority: int | None = None) -> Manifest:
    """The Kueue Workload of a queued service: its pod sets' templates are the StatefulSets' as they
    run at the pod sets' counts, before an admission's flavors are merged in (``plan/kueue.py``)."""
    count, _ = worker_counts(svc)
    dispatcher = build_dispatcher_statefulset(svc, settings, count)["spec"]["template"]
    workers = build_worker_statefulset(svc, settings, count)["spec"]["template"]
    return build_workload(svc, dispatcher, workers, priority)
