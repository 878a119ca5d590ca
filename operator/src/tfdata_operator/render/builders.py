"""Pure builders: a ServiceSpec in, the manifests of the TFDataService's children out.

No I/O and no Kubernetes client here. Names, labels, ports, the pods' server
configuration and the static worker list are all decided in this module, so
``tfdata-operator render`` and the running operator produce the same objects.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfdata_operator import __version__
from tfdata_operator.api.identity import (
    API_VERSION,
    CLIENT_LABEL,
    COMPONENT_LABEL,
    CONFIG_HASH_ANNOTATION,
    INSTANCE_LABEL,
    KIND,
    MANAGED_BY_LABEL,
    MANAGER,
    NAME_LABEL,
)
from tfdata_operator.api.spec import (
    CPU_METRIC,
    JOURNAL_MOUNT,
    JOURNAL_VOLUME,
    SNAPSHOTS_VOLUME,
    TFDATA_METRIC,
    TMP_MOUNT,
    TMP_VOLUME,
    PodSettings,
    ServiceSpec,
    default_requests,
    parse_quantity,
)
from tfdata_operator.wire import discovery, serverconfig, serverinfo, signals, snapshots

DEFAULT_WORK_DIR = f"{JOURNAL_MOUNT}/journal"
DEFAULT_INJECTOR_IMAGE = f"tfdata-operator:{__version__}"
# The emptyDir the injected server program lives in (serverconfig.INJECT_MOUNT).
PROGRAM_VOLUME = "tfdata-server-program"
# What an image of the user's may lack that the server program needs in its environment: a
# writable home (Keras writes ~/.keras) under the read-only root, and logs as they come. Defaults
# only: a variable of the same name in spec.<component>.env replaces the operator's.
INJECTED_ENV = (("HOME", TMP_MOUNT), ("KERAS_HOME", f"{TMP_MOUNT}/.keras"), ("PYTHONUNBUFFERED", "1"))
SERVER_UID = 1000
DISPATCHER = "dispatcher"
WORKER = "worker"


@dataclass(frozen=True)
class BuildSettings:
    """Operator-wide settings the manifests depend on."""

    cluster_domain: str = "cluster.local"
    # Where the operator's own requests come from (its namespace and pod labels), for the rule of
    # each NetworkPolicy that lets it read the dispatcher's signals (spec.autoscaling.metric TFData).
    # None when it runs outside the cluster: its requests then come from a node, which every
    # NetworkPolicy admits anyway.
    operator_namespace: str | None = None
    operator_pod_labels: tuple[tuple[str, str], ...] = ()
    # The image whose init container copies the server program into pods of an image of the
    # user's (spec.serverProgram Injected): the operator's own, which holds the same program.
    injector_image: str = DEFAULT_INJECTOR_IMAGE


Manifest = dict[str, Any]


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


def _metadata(svc: ServiceSpec, name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": svc.namespace,
        "labels": labels(svc, component),
        "ownerReferences": [owner_reference(svc)],
    }


# --- Server configuration ------------------------------------------------------------


def journal_base(svc: ServiceSpec) -> str | None:
    """Where the dispatcher journals: the user's workDir, or the journal volume, or nowhere."""
    d = svc.dispatcher
    return d.work_dir or (DEFAULT_WORK_DIR if d.storage.enabled else None)


def static_journal(
    svc: ServiceSpec, settings: BuildSettings, worker_count: int, live_config: Mapping[str, Any] | None
) -> str:
    """The journal subdirectory of a static dispatcher with ``worker_count`` workers.

    The running dispatcher's journal is kept while its worker list stays the same (a restart
    replays it). A changed list gets a journal of its own, named after the generation that
    changed it, and never an older one: TensorFlow's journal keeps every worker that ever
    registered (a shorter list would then fail every new job), and a replayed older journal
    would count workers as registered before they heartbeat and hand out task ids those
    long-running workers already used under the newer one, which they answer with end of
    sequence (the client silently misses their shards).
    """
    base = (journal_base(svc) or "").rstrip("/")
    live = live_config or {}
    live_dir = live.get("work_dir")
    if live.get("worker_addresses") == worker_addresses(svc, settings, worker_count) and isinstance(live_dir, str):
        leaf = live_dir[len(base) + 1 :] if live_dir.startswith(base + "/") else ""
        if serverconfig.STATIC_JOURNAL_NAME.fullmatch(leaf):
            return leaf
    return f"{worker_count}-workers-g{svc.generation}"


def dispatcher_config(
    svc: ServiceSpec, settings: BuildSettings, worker_count: int, journal: str | None = None
) -> serverconfig.DispatcherServerConfig:
    """The dispatcher's configuration; ``worker_count`` sizes the static worker list.

    ``journal`` is a static dispatcher's journal subdirectory (see ``static_journal``); by
    default the one a new service starts with.
    """
    d = svc.dispatcher
    work_dir = journal_base(svc)
    static_journal_dir = work_dir is not None and svc.is_static
    if work_dir is not None and svc.is_static:
        work_dir = f"{work_dir.rstrip('/')}/{journal or static_journal(svc, settings, worker_count, None)}"
    # A user's workDir may be given to other services too (the journal volume is this service's
    # own): the dispatcher claims it with a marker, and refuses one another service claimed.
    owner_marker = f"{d.work_dir.rstrip('/')}/{serverconfig.OWNER_MARKER_NAME}" if d.work_dir else None
    return serverconfig.DispatcherServerConfig(
        port=d.port,
        health_port=d.health_port,
        work_dir=work_dir,
        fault_tolerant_mode=d.fault_tolerant_mode,
        worker_addresses=tuple(worker_addresses(svc, settings, worker_count)) if svc.is_static else None,
        job_gc_check_interval_ms=d.job_gc_check_interval_ms,
        job_gc_timeout_ms=d.job_gc_timeout_ms,
        client_timeout_ms=d.client_timeout_ms,
        worker_timeout_ms=d.worker_timeout_ms,
        worker_max_concurrent_snapshots=d.worker_max_concurrent_snapshots,
        prune_old_journals=static_journal_dir,
        worker_health_port=svc.workers.health_port,
        cpu_given_millicores=cpu_given_millicores(d.pod, DISPATCHER),
        preload_modules=svc.preload.modules,
        preload_op_libraries=svc.preload.op_libraries,
        # As the pods see it: a volume is mounted at that path (operator_volumes), a URL is the same
        # store in every pod; the operator and the trainers' helper join names to it as written.
        snapshot_dir=svc.snapshots.directory if svc.snapshots else None,
        owner=f"{svc.namespace}/{svc.name}" if owner_marker else None,
        owner_marker=owner_marker,
    )


# A static dispatcher is ready once every listed worker has registered, and workers that kept
# running through its restart re-register on their next heartbeat: the heartbeat bounds every
# static rescale. At 1 s it costs the dispatcher ~16 millicores with 16 workers (docs/sharding.md,
# benchmarks/bench_heartbeat.py), against ~4 at the server program's 5 s default.
STATIC_HEARTBEAT_MS = 1_000


def worker_config(svc: ServiceSpec, settings: BuildSettings) -> serverconfig.WorkerServerConfig:
    w = svc.workers
    transfer_format = None
    if w.data_transfer_protocol is not None:
        # TensorFlow fills in %dts_port% with the data transfer server's port.
        transfer_format = worker_address_format(svc, settings, "%dts_port%")
    return serverconfig.WorkerServerConfig(
        port=w.port,
        health_port=w.health_port,
        dispatcher_address=f"{dispatcher_host(svc, settings)}:{svc.dispatcher.port}",
        worker_address_format=worker_address_format(svc, settings, w.port),
        heartbeat_interval_ms=w.heartbeat_interval_ms or (STATIC_HEARTBEAT_MS if svc.is_static else None),
        dispatcher_timeout_ms=w.dispatcher_timeout_ms,
        data_transfer_protocol=w.data_transfer_protocol,
        data_transfer_port=w.data_transfer_port,
        data_transfer_address_format=transfer_format,
        cpu_given_millicores=cpu_given_millicores(w.pod, WORKER),
        preload_modules=svc.preload.modules,
        preload_op_libraries=svc.preload.op_libraries,
        cross_trainer_cache_size_bytes=w.cross_trainer_cache_size_bytes,
    )


def cpu_given_millicores(pod: PodSettings, component: str) -> int | None:
    """The CPU a server's /metrics divides by: its limit, the most it can use, else its request
    (the default request where the user set neither, as the container gets it).

    Without either the server falls back to its cgroup's quota or the machine's CPUs.
    """
    resources = default_requests(pod, component)
    for kind in ("limits", "requests"):
        cpu = resources.get(kind, {}).get("cpu")
        if cpu is not None:
            return max(1, round(parse_quantity(cpu) * 1000))
    return None


def config_hash(config_json: str) -> str:
    return hashlib.sha256(config_json.encode()).hexdigest()[:16]


def read_config(statefulset: Manifest | None) -> dict[str, Any] | None:
    """The server configuration inside a (live) StatefulSet, or None if it has none."""
    if not statefulset:
        return None
    containers = statefulset.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []
    for container in containers:
        for env in container.get("env") or []:
            if env.get("name") == serverconfig.CONFIG_ENV and env.get("value"):
                try:
                    parsed = json.loads(env["value"])
                except json.JSONDecodeError:
                    return None
                return parsed if isinstance(parsed, dict) else None
    return None


# --- Children --------------------------------------------------------------------------


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
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(svc, name, component), "spec": spec}


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
    return _service(svc, workers_name(svc), WORKER, _worker_ports(svc), headless=True)


def _worker_ports(svc: ServiceSpec) -> dict[str, int]:
    ports = {"grpc": svc.workers.port}
    if svc.workers.data_transfer_port is not None:
        ports["data-transfer"] = svc.workers.data_transfer_port
    return ports


def build_dispatcher_statefulset(
    svc: ServiceSpec, settings: BuildSettings, worker_count: int, journal: str | None = None
) -> Manifest:
    """One dispatcher pod; its journal claim comes from volumeClaimTemplates."""
    config = dispatcher_config(svc, settings, worker_count, journal)
    d = svc.dispatcher
    mounts = [{"name": JOURNAL_VOLUME, "mountPath": JOURNAL_MOUNT}] if d.storage.enabled else []
    sts: Manifest = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(svc, dispatcher_name(svc), DISPATCHER),
        "spec": {
            # Suspended: no pod, and the same template, so a resume replays the same journal.
            "replicas": 0 if svc.suspend else 1,
            "serviceName": dispatcher_pods_name(svc),
            "selector": {"matchLabels": selector_labels(svc, DISPATCHER)},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": _pod_template(
                svc, settings, DISPATCHER, d.pod, serverconfig.to_json(config), {"grpc": d.port}, d.health_port, mounts
            ),
        },
    }
    if d.storage.enabled:
        claim_spec: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": d.storage.size}},
        }
        if d.storage.storage_class_name:
            claim_spec["storageClassName"] = d.storage.storage_class_name
        sts["spec"]["volumeClaimTemplates"] = [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": JOURNAL_VOLUME, "labels": labels(svc, DISPATCHER)},
                "spec": claim_spec,
            }
        ]
        sts["spec"]["persistentVolumeClaimRetentionPolicy"] = {
            "whenDeleted": d.storage.when_deleted,
            "whenScaled": "Retain",
        }
    return sts


def build_worker_statefulset(svc: ServiceSpec, settings: BuildSettings, replicas: int) -> Manifest:
    """The workers; ``replicas`` is decided by the scaling plan, not always the spec's count."""
    w = svc.workers
    ports = _worker_ports(svc)
    config_json = serverconfig.to_json(worker_config(svc, settings))
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(svc, workers_name(svc), WORKER),
        "spec": {
            "replicas": replicas,
            "serviceName": workers_name(svc),
            # Workers are independent: start and stop them together, not one by one.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector_labels(svc, WORKER)},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": _pod_template(svc, settings, WORKER, w.pod, config_json, ports, w.health_port, []),
        },
    }


def build_hpa(svc: ServiceSpec) -> Manifest | None:
    """A HorizontalPodAutoscaler on this TFDataService's scale subresource, for ``metric: CPU``.

    With ``metric: TFData`` the operator itself decides (``autoscaler.py``): an HPA would fight it.
    """
    a = svc.autoscaling
    if a is None or a.metric != CPU_METRIC or svc.suspend:
        return None  # suspended: autoscaling is paused (it would scale on the metrics of no pods)
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(svc, workers_name(svc), WORKER),
        "spec": {
            "scaleTargetRef": {"apiVersion": API_VERSION, "kind": KIND, "name": svc.name},
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": a.target_cpu_utilization_percentage},
                    },
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": a.scale_down_stabilization_window_seconds}},
        },
    }


def build_worker_pdb(svc: ServiceSpec, max_unavailable: int = 1) -> Manifest | None:
    """How many workers a voluntary disruption (a node drain, an eviction) may take at once.

    ``max_unavailable`` is ``plan.drain``'s: 0 while a client reads a static service (a moved
    worker would read its shard again), else 1. A worker that is not Ready serves nobody, so it
    may always be evicted (``unhealthyPodEvictionPolicy: AlwaysAllow``): it never blocks a drain.
    With "OFF" a replaced worker just starts over, so no budget.
    """
    if svc.sharding_policy == "OFF":
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(svc, workers_name(svc), WORKER),
        "spec": {
            "maxUnavailable": max_unavailable,
            "selector": {"matchLabels": selector_labels(svc, WORKER)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def build_network_policy(svc: ServiceSpec, settings: BuildSettings) -> Manifest | None:
    """tf.data service has no authentication: only labelled clients and the service's own pods get in.

    The health ports serve more than probes: /metrics (the dispatcher reads its workers'),
    the trainers' reports and /v1/signals (the dispatcher's), so they are open to the same peers,
    and to the operator, for those ports only: it reads the dispatcher's /v1/signals (the TFData
    autoscaler, and a rescale or suspend held while clients read, under any autoscaling) and an
    unready server's /readyz (the status's explanation). Kubelets' probes come from the node,
    which a NetworkPolicy never blocks.
    """
    policy = svc.network_policy
    if not policy.enabled:
        return None
    ports = [svc.dispatcher.port, svc.workers.port, svc.dispatcher.health_port, svc.workers.health_port]
    if svc.workers.data_transfer_port is not None:
        ports.append(svc.workers.data_transfer_port)
    peers = [
        {"podSelector": {"matchLabels": instance_labels(svc)}},
        {"podSelector": {"matchLabels": {CLIENT_LABEL: svc.name}}},
        *(dict(peer) for peer in policy.extra_from),
    ]
    ingress: list[Manifest] = [{"from": peers, "ports": _tcp(ports)}]
    if (operator := operator_peer(settings)) is not None:
        ingress.append({"from": [operator], "ports": _tcp([svc.dispatcher.health_port, svc.workers.health_port])})
    spec: Manifest = {"podSelector": {"matchLabels": instance_labels(svc)}, "policyTypes": ["Ingress"]}
    spec["ingress"] = ingress
    if policy.egress is not None:
        spec["policyTypes"] = ["Ingress", "Egress"]
        spec["egress"] = [{"to": egress_peers(policy.egress.except_)}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(svc, network_policy_name(svc), "network-policy"),
        "spec": spec,
    }


def egress_peers(excluded: tuple[str, ...]) -> list[Manifest]:
    """Where the servers may connect with spec.networkPolicy.egress: every pod of every namespace
    (each other, DNS, a trainer, a store in the cluster), and every address but ``excluded``.

    The pods are a peer of their own because some network plugins (Cilium) never match a pod's
    address with an ipBlock; so an address in ``excluded`` that is a pod's stays reachable.
    """
    blocks: list[Manifest] = []
    for everything, version in (("0.0.0.0/0", 4), ("::/0", 6)):
        block: Manifest = {"cidr": everything}
        if excepted := [c for c in excluded if ipaddress.ip_network(c).version == version]:
            block["except"] = excepted
        blocks.append({"ipBlock": block})
    return [{"namespaceSelector": {}}, *blocks]


def reads_signals(svc: ServiceSpec) -> bool:
    """Whether the operator reads the dispatcher's /v1/signals (its TFData autoscaler)."""
    return svc.autoscaling is not None and svc.autoscaling.metric == TFDATA_METRIC


def operator_peer(settings: BuildSettings) -> Manifest | None:
    """The NetworkPolicyPeer of the operator's pod: its namespace and its labels, both."""
    if settings.operator_namespace is None:
        return None
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": settings.operator_namespace}},
        "podSelector": {"matchLabels": dict(settings.operator_pod_labels)},
    }


def _tcp(ports: list[int]) -> list[Manifest]:
    return [{"protocol": "TCP", "port": p} for p in sorted(set(ports))]


# --- One render function per child kind (the rows of ``plan.children.CHILDREN``) -------------


@dataclass(frozen=True)
class Counts:
    """What the plan decides before anything is rendered (``plan.scaling``).

    The length of a static dispatcher's worker list, the worker replicas (0 while suspended),
    and a static dispatcher's journal subdirectory (``static_journal``).
    """

    dispatcher_workers: int
    worker_replicas: int
    journal: str | None = None
    # What the servers reported (status.server), which the client ConfigMap publishes.
    server: Mapping[str, Any] | None = None
    # The workers' PodDisruptionBudget (plan.drain): 0 while a client reads a static service.
    max_unavailable: int = 1


# A child by name: its manifest, or None when this spec wants no such object (it is deleted).
Named = tuple[str, Manifest | None]


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


def _pod_template(
    svc: ServiceSpec,
    settings: BuildSettings,
    component: str,
    pod: PodSettings,
    config_json: str,
    ports: dict[str, int],
    health_port: int,
    mounts: list[dict[str, Any]],
) -> Manifest:
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
    optional = {
        "serviceAccountName": pod.service_account_name,
        "priorityClassName": pod.priority_class_name,
        "nodeSelector": dict(pod.node_selector) or None,
        "tolerations": [dict(t) for t in pod.tolerations] or None,
        "affinity": _affinity(svc, component, pod) or None,
        "topologySpreadConstraints": [dict(c) for c in pod.topology_spread_constraints or ()] or None,
        "imagePullSecrets": [{"name": s} for s in svc.image_pull_secrets] or None,
    }
    pod_spec.update({k: v for k, v in optional.items() if v is not None})
    return {
        "metadata": {
            "labels": {**pod.labels, **labels(svc, component)},
            "annotations": {**pod.annotations, CONFIG_HASH_ANNOTATION: config_hash(config_json)},
        },
        "spec": pod_spec,
    }


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
        "metadata": _metadata(svc, client_configmap_name(svc), "client"),
        "data": discovery.to_data(client_settings(svc, settings, server)),
    }
