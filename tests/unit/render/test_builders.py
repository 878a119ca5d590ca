"""The pure builders: names, labels, ownership, ports, the pods' configuration, the HPA."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tfdata_operator.api import identity, kueue, spec
from tfdata_operator.api import snapshot as snapshotapi
from tfdata_operator.client import snapshots as client_snapshots
from tfdata_operator.plan import children
from tfdata_operator.render import builders
from tfdata_operator.render.builders import BuildSettings
from tfdata_operator.wire import serverconfig
from tfdata_operator.wire import snapshots as wire_snapshots

from fixtures.cases import IMAGE, OWNER, body, parse
from fixtures.manifests import API_VERSION


def container(sts: dict[str, Any]) -> dict[str, Any]:
    return sts["spec"]["template"]["spec"]["containers"][0]


def pod_config(sts: dict[str, Any], kind: str, pod_name: str) -> serverconfig.ServerConfig:
    env = {e["name"]: e for e in container(sts)["env"]}
    return serverconfig.load(kind, environ={serverconfig.CONFIG_ENV: env[serverconfig.CONFIG_ENV]["value"]})


def test_names_labels_and_owner(settings: BuildSettings) -> None:
    svc = parse(shardingPolicy="DYNAMIC")
    sts = builders.build_worker_statefulset(svc, settings, 2)
    assert sts["metadata"]["name"] == "demo-worker"
    assert sts["metadata"]["namespace"] == "ml"
    assert sts["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "tfdata-operator"
    assert sts["metadata"]["ownerReferences"] == [OWNER]
    selector = sts["spec"]["selector"]["matchLabels"]
    assert selector.items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert builders.worker_selector(svc) == ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def test_dispatcher_address_is_the_client_service(settings: BuildSettings) -> None:
    svc = parse(dispatcher={"port": 6000})
    assert builders.dispatcher_address(svc, settings) == "grpc://demo-dispatcher.ml.svc.cluster.local:6000"
    service = builders.build_dispatcher_service(svc)
    assert service["spec"]["ports"][0]["port"] == 6000
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "dispatcher"
    assert service["spec"]["publishNotReadyAddresses"] is True  # workers register before it is ready


def test_workers_are_a_parallel_statefulset_behind_a_headless_service(settings: BuildSettings) -> None:
    svc = parse(workers={"replicas": 3})
    sts = builders.build_worker_statefulset(svc, settings, 3)
    headless = builders.build_worker_service(svc)
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True


@pytest.mark.parametrize("policy", ["FILE", "DATA", "FILE_OR_DATA", "HINT"])
def test_static_worker_list_is_exactly_what_each_worker_announces(policy: str, settings: BuildSettings) -> None:
    svc = parse(shardingPolicy=policy, workers={"replicas": 3})
    dispatcher = pod_config(builders.build_dispatcher_statefulset(svc, settings, 3), "dispatcher", "demo-dispatcher-0")
    workers = builders.build_worker_statefulset(svc, settings, 3)
    announced = []
    for i in range(3):
        cfg = pod_config(workers, "worker", f"demo-worker-{i}")
        assert isinstance(cfg, serverconfig.WorkerServerConfig)
        announced.append(cfg.worker_address(f"demo-worker-{i}"))
    assert isinstance(dispatcher, serverconfig.DispatcherServerConfig)
    assert list(dispatcher.worker_addresses or ()) == announced
    assert announced[0] == "demo-worker-0.demo-worker.ml.svc.cluster.local:5051"
    assert "localhost" not in "".join(announced)


@pytest.mark.parametrize("policy", ["OFF", "DYNAMIC"])
def test_dynamic_policies_give_the_dispatcher_no_worker_list(policy: str, settings: BuildSettings) -> None:
    svc = parse(shardingPolicy=policy)
    a = builders.build_dispatcher_statefulset(svc, settings, 2)
    b = builders.build_dispatcher_statefulset(svc, settings, 5)
    assert a == b, "the worker count must not restart a dispatcher that has no worker list"
    assert "worker_addresses" not in builders.read_config(a)  # type: ignore[operator]


def test_a_queued_services_pod_sets_run_its_statefulsets_pod_templates_at_the_pod_sets_counts() -> None:
    doc = body(shardingPolicy="FILE", workers={"replicas": 3})
    doc["metadata"]["labels"] = {kueue.QUEUE_LABEL: "team-a"}
    svc = spec.parse(doc, IMAGE)
    settings = BuildSettings(cluster_domain="corp.example")
    dispatcher, workers = builders.render_workload(svc, settings)["spec"]["podSets"]
    for pod_set, sts in [
        (dispatcher, builders.build_dispatcher_statefulset(svc, settings, 3)),
        (workers, builders.build_worker_statefulset(svc, settings, 3)),
    ]:
        template = sts["spec"]["template"]
        assert pod_set["template"]["spec"] == template["spec"]
        assert pod_set["template"]["metadata"]["annotations"] == template["metadata"]["annotations"]
    # The static dispatcher admitted with the workers pod set lists each of its 3 workers, in this cluster.
    config = builders.read_config({"spec": {"template": dispatcher["template"]}})
    assert config is not None and len(config["worker_addresses"]) == 3
    assert config["worker_addresses"][2] == "demo-worker-2.demo-worker.ml.svc.corp.example:5051"


def test_static_count_change_rolls_the_dispatcher_through_its_config_hash(settings: BuildSettings) -> None:
    svc = parse(shardingPolicy="FILE")
    hashes = {
        builders.build_dispatcher_statefulset(svc, settings, n)["spec"]["template"]["metadata"]["annotations"][
            identity.CONFIG_HASH_ANNOTATION
        ]
        for n in (2, 3)
    }
    assert len(hashes) == 2


def test_every_dispatcher_setting_reaches_the_pod(settings: BuildSettings) -> None:
    svc = parse(
        dispatcher={
            "port": 7000,
            "healthPort": 7001,
            "workDir": "gs://bucket/journal",
            "jobGcCheckIntervalMs": 1000,
            "jobGcTimeoutMs": 2000,
            "clientTimeoutMs": 3000,
            "workerTimeoutMs": 4000,
            "workerMaxConcurrentSnapshots": 2,
            "gcDynamicShardingJobs": False,
            "resources": {"requests": {"cpu": "250m"}},
        },
        workers={"healthPort": 7201},
    )
    cfg = pod_config(builders.build_dispatcher_statefulset(svc, settings, 2), "dispatcher", "x")
    assert cfg == serverconfig.DispatcherServerConfig(
        port=7000,
        health_port=7001,
        work_dir="gs://bucket/journal",
        fault_tolerant_mode=True,
        job_gc_check_interval_ms=1000,
        job_gc_timeout_ms=2000,
        client_timeout_ms=3000,
        worker_timeout_ms=4000,
        worker_max_concurrent_snapshots=2,
        gc_dynamic_sharding_jobs=False,  # DYNAMIC jobs kept (the server program collects them by default)
        worker_health_port=7201,  # it reads its workers' /metrics there
        cpu_given_millicores=250,
        owner="ml/demo",  # a user's workDir is claimed (review O7)
        owner_marker="gs://bucket/journal/tfdata-owner",
    )


@pytest.mark.parametrize(
    ("resources", "millicores"),
    [
        ({}, 250),  # the default request: what the container gets
        ({"requests": {"cpu": "500m"}}, 500),
        ({"requests": {"cpu": "500m"}, "limits": {"cpu": "2"}}, 2000),  # the limit: the most it can use
        ({"limits": {"cpu": "1.5", "memory": "1Gi"}}, 1500),
        ({"requests": {"memory": "1Gi"}}, 250),
        ({"requests": {"cpu": "1m"}}, 1),  # the smallest CPU Kubernetes can express
    ],
)
def test_workers_cpu_given_is_the_limit_else_the_request(
    settings: BuildSettings, resources: dict[str, Any], millicores: int | None
) -> None:
    svc = parse(workers={"resources": resources})
    cfg = pod_config(builders.build_worker_statefulset(svc, settings, 2), "worker", "x")
    assert cfg.cpu_given_millicores == millicores


def test_every_worker_setting_reaches_the_pod(settings: BuildSettings) -> None:
    svc = parse(
        workers={
            "port": 7100,
            "healthPort": 7101,
            "heartbeatIntervalMs": 500,
            "dispatcherTimeoutMs": 60000,
            "dataTransferProtocol": "grpc",
        }
    )
    # TensorFlow 2.21 has no protocol that uses a port of its own, so the spec refuses
    # dataTransferPort; the builders still carry one through for the protocol that will.
    svc = dataclasses.replace(svc, workers=dataclasses.replace(svc.workers, data_transfer_port=7102))
    sts = builders.build_worker_statefulset(svc, settings, 2)
    cfg = pod_config(sts, "worker", "demo-worker-1")
    assert isinstance(cfg, serverconfig.WorkerServerConfig)
    assert cfg.dispatcher_address == "demo-dispatcher.ml.svc.cluster.local:5050"
    assert (cfg.port, cfg.health_port, cfg.heartbeat_interval_ms, cfg.dispatcher_timeout_ms) == (7100, 7101, 500, 60000)
    assert (cfg.data_transfer_protocol, cfg.data_transfer_port) == ("grpc", 7102)
    assert cfg.data_transfer_address("demo-worker-1") == "demo-worker-1.demo-worker.ml.svc.cluster.local:%dts_port%"
    ports = {p["name"]: p["containerPort"] for p in container(sts)["ports"]}
    assert ports == {"grpc": 7100, "data-transfer": 7102, "health": 7101}


def test_journal_claim_and_its_retention(settings: BuildSettings) -> None:
    svc = parse(dispatcher={"storage": {"size": "5Gi", "storageClassName": "fast", "whenDeleted": "Delete"}})
    sts = builders.build_dispatcher_statefulset(svc, settings, 2)
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"
    mounts = {m["name"]: m["mountPath"] for m in container(sts)["volumeMounts"]}
    assert mounts[builders.JOURNAL_VOLUME] == builders.JOURNAL_MOUNT
    cfg = pod_config(sts, "dispatcher", "x")
    assert cfg.work_dir == builders.DEFAULT_WORK_DIR  # type: ignore[union-attr]


def test_no_claim_when_journal_lives_elsewhere(settings: BuildSettings) -> None:
    svc = parse(dispatcher={"workDir": "gs://b/j", "storage": {"enabled": False}})
    sts = builders.build_dispatcher_statefulset(svc, settings, 2)
    assert "volumeClaimTemplates" not in sts["spec"]
    assert [m["name"] for m in container(sts)["volumeMounts"]] == ["tmp"]


def test_pods_are_locked_down_by_default(settings: BuildSettings) -> None:
    sts = builders.build_worker_statefulset(parse(), settings, 2)
    pod = sts["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # A data claim whose root has the pods' group already is not re-owned file by file at each start.
    assert pod["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    sc = container(sts)["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert container(sts)["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


def test_placement_and_metadata_reach_the_pod(settings: BuildSettings) -> None:
    svc = parse(
        image="registry.example/tfdata:1",
        imagePullPolicy="Always",
        imagePullSecrets=[{"name": "pull"}],
        workers={
            "nodeSelector": {"pool": "cpu"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "affinity": {"nodeAffinity": {}},
            "priorityClassName": "high",
            "serviceAccountName": "reader",
            "labels": {"team": "ml"},
            "annotations": {"note": "x"},
            "resources": {"requests": {"cpu": 1}},
        },
    )
    sts = builders.build_worker_statefulset(svc, settings, 2)
    template = sts["spec"]["template"]
    pod = template["spec"]
    assert pod["nodeSelector"] == {"pool": "cpu"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert pod["priorityClassName"] == "high"
    assert pod["serviceAccountName"] == "reader" and pod["automountServiceAccountToken"] is True
    assert pod["imagePullSecrets"] == [{"name": "pull"}]
    assert template["metadata"]["labels"]["team"] == "ml"
    assert template["metadata"]["annotations"]["note"] == "x"
    assert container(sts)["image"] == "registry.example/tfdata:1"
    assert container(sts)["imagePullPolicy"] == "Always"
    # The user's CPU request, and the default memory and disk requests the user left unset.
    assert container(sts)["resources"] == {"requests": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "2Gi"}}
    assert pod["affinity"]["nodeAffinity"] == {}


def test_servers_request_sensible_resources_by_default(settings: BuildSettings) -> None:
    svc = parse()
    dispatcher = container(builders.build_dispatcher_statefulset(svc, settings, 2))
    worker = container(builders.build_worker_statefulset(svc, settings, 2))
    # Disk: as much as /tmp may hold (spec.<component>.tmpSizeLimit), the one place a server writes.
    assert dispatcher["resources"] == {"requests": {"cpu": "100m", "memory": "512Mi", "ephemeral-storage": "1Gi"}}
    assert worker["resources"] == {"requests": {"cpu": "250m", "memory": "1Gi", "ephemeral-storage": "2Gi"}}
    # A lone limit is the request too (Kubernetes copies it): no default request below or above it.
    limited = parse(workers={"resources": {"limits": {"memory": "4Gi", "ephemeral-storage": "8Gi"}}})
    assert container(builders.build_worker_statefulset(limited, settings, 2))["resources"] == {
        "requests": {"cpu": "250m"},
        "limits": {"memory": "4Gi", "ephemeral-storage": "8Gi"},
    }


def test_tmp_is_bounded_and_its_bound_is_what_the_pod_requests_of_the_nodes_disk(settings: BuildSettings) -> None:
    def tmp_and_request(svc: spec.ServiceSpec, build: Any) -> tuple[Any, Any]:
        sts = build(svc, settings, 2)
        (tmp,) = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == spec.TMP_VOLUME]
        return tmp["emptyDir"], container(sts)["resources"]["requests"].get("ephemeral-storage")

    dispatcher, workers = builders.build_dispatcher_statefulset, builders.build_worker_statefulset
    assert tmp_and_request(parse(), dispatcher) == ({"sizeLimit": "1Gi"}, "1Gi")
    assert tmp_and_request(parse(), workers) == ({"sizeLimit": "2Gi"}, "2Gi")
    svc = parse(dispatcher={"tmpSizeLimit": "256Mi"}, workers={"tmpSizeLimit": "20Gi"})
    assert tmp_and_request(svc, dispatcher) == ({"sizeLimit": "256Mi"}, "256Mi")
    assert tmp_and_request(svc, workers) == ({"sizeLimit": "20Gi"}, "20Gi")
    # The user's own request of disk is kept as it is; the size of /tmp still holds.
    own = parse(workers={"tmpSizeLimit": "20Gi", "resources": {"requests": {"ephemeral-storage": "5Gi"}}})
    assert tmp_and_request(own, workers) == ({"sizeLimit": "20Gi"}, "5Gi")


def test_workers_spread_across_nodes_unless_the_user_says_how(settings: BuildSettings) -> None:
    def pod(**workers: Any) -> dict[str, Any]:
        sts = builders.build_worker_statefulset(parse(workers=workers), settings, 2)
        return dict(sts["spec"]["template"]["spec"])

    preferred = pod()["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == [
        {
            "weight": 100,
            "podAffinityTerm": {
                "labelSelector": {"matchLabels": builders.selector_labels("demo", builders.WORKER)},
                "topologyKey": "kubernetes.io/hostname",
            },
        }
    ]
    own = {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]}
    assert pod(affinity={"podAntiAffinity": own})["affinity"] == {"podAntiAffinity": own}
    spread = [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]
    assert "affinity" not in pod(topologySpreadConstraints=spread)
    assert pod(topologySpreadConstraints=spread)["topologySpreadConstraints"] == spread
    assert "affinity" not in pod(topologySpreadConstraints=[])
    # One dispatcher: nothing to spread.
    dispatcher = builders.build_dispatcher_statefulset(parse(), settings, 2)
    assert "affinity" not in dispatcher["spec"]["template"]["spec"]


def test_the_dispatcher_statefulset_is_governed_by_a_headless_service(settings: BuildSettings) -> None:
    svc = parse()
    sts = builders.build_dispatcher_statefulset(svc, settings, 2)
    governing = builders.build_dispatcher_pods_service(svc)
    assert sts["spec"]["serviceName"] == governing["metadata"]["name"] == "demo-dispatcher-pods"
    assert governing["spec"]["clusterIP"] == "None"
    assert governing["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    # Trainers keep the ClusterIP Service: its address survives a new dispatcher pod.
    assert builders.build_dispatcher_service(svc)["spec"]["type"] == "ClusterIP"


def test_hpa_targets_the_scale_subresource() -> None:
    svc = parse(
        shardingPolicy="DYNAMIC",
        workers={"resources": {"requests": {"cpu": "500m"}}},
        autoscaling={"metric": "CPU", "minReplicas": 2, "maxReplicas": 6, "targetCPUUtilizationPercentage": 70},
    )
    hpa = builders.build_hpa(svc)
    assert hpa is not None
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": API_VERSION,
        "kind": "TFDataService",
        "name": "demo",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 70
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert builders.build_hpa(parse()) is None


def test_the_tfdata_metric_needs_no_hpa_and_no_cpu_request() -> None:
    # The operator decides itself; an HPA on the same scale subresource would fight it.
    svc = parse(shardingPolicy="DYNAMIC", autoscaling={"maxReplicas": 4})
    assert svc.autoscaling is not None and svc.autoscaling.metric == "TFData"
    assert builders.build_hpa(svc) is None
    rendered = children.render_all(svc, BuildSettings(), builders.Counts(1, 1))
    assert "HorizontalPodAutoscaler" not in [m["kind"] for _, (_, m) in rendered if m]


def test_network_policy_admits_only_labelled_clients_and_the_service_itself() -> None:
    svc = parse(networkPolicy={"from": [{"namespaceSelector": {"matchLabels": {"team": "ml"}}}]})
    policy = builders.build_network_policy(svc, BuildSettings())
    assert policy is not None
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == builders.instance_labels(svc)
    assert spec["policyTypes"] == ["Ingress"]
    # The health port too: the dispatcher reads its workers' /metrics there, and trainers report to
    # the dispatcher's. Kubelets probe from the node, which no NetworkPolicy blocks.
    (servers,) = spec["ingress"]
    assert {p["port"] for p in servers["ports"]} == {5050, 5051, 8080}
    assert {"podSelector": {"matchLabels": {"tfdata.dev/client": "demo"}}} in servers["from"]
    assert {"podSelector": {"matchLabels": builders.instance_labels(svc)}} in servers["from"]
    assert {"namespaceSelector": {"matchLabels": {"team": "ml"}}} in servers["from"]
    assert len(servers["from"]) == 3
    assert builders.build_network_policy(parse(networkPolicy={"enabled": False}), BuildSettings()) is None


def test_egress_is_not_restricted_unless_asked() -> None:
    for fields in ({}, {"egress": {}}, {"egress": {"enabled": False, "except": ["10.0.0.0/8"]}}):
        policy = builders.build_network_policy(parse(networkPolicy=fields), BuildSettings())
        assert policy is not None
        assert policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"], fields


def test_egress_admits_every_pod_and_every_address_but_the_metadata_server() -> None:
    svc = parse(networkPolicy={"egress": {"enabled": True}})
    policy = builders.build_network_policy(svc, IN_CLUSTER)
    assert policy is not None
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    # The ingress rules are the same as without egress rules.
    without = builders.build_network_policy(parse(), IN_CLUSTER)
    assert without is not None and spec["ingress"] == without["spec"]["ingress"]
    # One rule, every port and protocol (DNS over UDP too): each server reaches the others, DNS and
    # any pod, and every address outside the cluster but the metadata server's.
    assert spec["egress"] == [
        {
            "to": [
                {"namespaceSelector": {}},
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}},
                {"ipBlock": {"cidr": "::/0", "except": ["fd00:ec2::254/128"]}},
            ]
        }
    ]


def test_egress_except_is_split_by_address_family_and_may_be_empty() -> None:
    excepted = ["10.0.0.0/8", "fd00::/8", "192.168.1.7/32"]
    svc = parse(networkPolicy={"egress": {"enabled": True, "except": excepted}})
    assert builders.egress_peers(svc.network_policy.egress.except_ if svc.network_policy.egress else ()) == [
        {"namespaceSelector": {}},
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "192.168.1.7/32"]}},
        {"ipBlock": {"cidr": "::/0", "except": ["fd00::/8"]}},
    ]
    # Nothing excepted: no except list at all.
    assert builders.egress_peers(()) == [
        {"namespaceSelector": {}},
        {"ipBlock": {"cidr": "0.0.0.0/0"}},
        {"ipBlock": {"cidr": "::/0"}},
    ]


IN_CLUSTER = BuildSettings(
    operator_namespace="ops", operator_pod_labels=(("app.kubernetes.io/name", "tfdata-operator"),)
)
TFDATA = {"shardingPolicy": "DYNAMIC", "autoscaling": {"maxReplicas": 4}}
CPU = {
    "shardingPolicy": "DYNAMIC",
    "autoscaling": {"maxReplicas": 4, "metric": "CPU"},
    "workers": {"resources": {"requests": {"cpu": "1"}}},
}


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param(TFDATA, id="tfdata-autoscaled"),  # the autoscaler reads /v1/signals
        pytest.param({"shardingPolicy": "FILE"}, id="static"),  # a held rescale reads /v1/signals
        pytest.param({}, id="not-autoscaled"),  # a held suspend reads /v1/signals, the diagnosis /readyz
        pytest.param(CPU, id="cpu-metric"),
    ],
)
def test_network_policy_admits_the_operator_to_the_health_ports_only(fields: dict[str, Any]) -> None:
    svc = parse(**{**fields, "dispatcher": {"healthPort": 9090}})
    policy = builders.build_network_policy(svc, IN_CLUSTER)
    assert policy is not None
    servers, operator = policy["spec"]["ingress"]
    assert {p["port"] for p in servers["ports"]} == {5050, 5051, 8080, 9090}
    # One peer with both selectors: pods with these labels in that namespace (two peers would
    # admit every pod of the namespace, and pods with these labels anywhere).
    assert operator == {
        "from": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "tfdata-operator"}},
            }
        ],
        "ports": [{"protocol": "TCP", "port": 8080}, {"protocol": "TCP", "port": 9090}],
    }


def test_network_policy_of_an_operator_outside_the_cluster_admits_no_namespace() -> None:
    policy = builders.build_network_policy(parse(**TFDATA), BuildSettings())
    assert policy is not None
    (servers,) = policy["spec"]["ingress"]
    assert all("namespaceSelector" not in peer for peer in servers["from"])


@pytest.mark.parametrize(("policy", "expected"), [("OFF", False), ("DYNAMIC", True), ("FILE", True)])
def test_worker_disruption_budget_where_losing_a_worker_costs_data(policy: str, expected: bool) -> None:
    pdb = builders.build_worker_pdb(parse(shardingPolicy=policy))
    assert (pdb is not None) == expected
    if pdb:
        assert pdb["spec"]["maxUnavailable"] == 1
        assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"


def test_a_new_static_dispatcher_journals_per_worker_count_and_generation(settings: BuildSettings) -> None:
    """TensorFlow's journal keeps every worker that ever registered: each list gets its own."""
    svc = parse(generation=4, shardingPolicy="FILE")
    configs = {n: builders.dispatcher_config(svc, settings, n) for n in (2, 3)}
    assert {n: c.work_dir for n, c in configs.items()} == {
        2: f"{builders.DEFAULT_WORK_DIR}/2-workers-g4",
        3: f"{builders.DEFAULT_WORK_DIR}/3-workers-g4",
    }
    assert all(c.prune_old_journals for c in configs.values())
    custom = parse(shardingPolicy="DATA", dispatcher={"workDir": "gs://bucket/journal/"})
    assert builders.dispatcher_config(custom, settings, 4).work_dir == "gs://bucket/journal/4-workers-g1"
    dynamic = builders.dispatcher_config(parse(shardingPolicy="DYNAMIC"), settings, 4)
    assert (dynamic.work_dir, dynamic.prune_old_journals) == (builders.DEFAULT_WORK_DIR, False)
    no_journal = parse(shardingPolicy="FILE", dispatcher={"faultTolerantMode": False, "storage": {"enabled": False}})
    assert (builders.dispatcher_config(no_journal, settings, 2).work_dir, no_journal.is_static) == (None, True)


@pytest.mark.parametrize(
    ("policy", "work_dir", "journal"),
    [
        ("DYNAMIC", "gs://bucket/journal", "gs://bucket/journal"),
        ("FILE", "gs://bucket/journal/", "gs://bucket/journal/2-workers-g1"),
        ("DATA", "/shared/journal", "/shared/journal/2-workers-g1"),
    ],
)
def test_a_user_work_dir_is_claimed_by_the_service_in_its_journal_base(
    settings: BuildSettings, policy: str, work_dir: str, journal: str
) -> None:
    """Two services given one workDir would share (or prune) each other's journals: the marker says whose it is."""
    svc = parse(shardingPolicy=policy, dispatcher={"workDir": work_dir})
    config = builders.dispatcher_config(svc, settings, 2)
    assert (config.work_dir, config.owner) == (journal, "ml/demo")
    # Beside the static <N>-workers-g<gen> journals, so every generation of the service finds it.
    assert config.owner_marker == "/".join([work_dir.rstrip("/"), serverconfig.OWNER_MARKER_NAME])
    config.validate()


@pytest.mark.parametrize("policy", ["DYNAMIC", "FILE"])
def test_the_journal_volume_is_the_service_own_and_claims_nothing(settings: BuildSettings, policy: str) -> None:
    config = builders.dispatcher_config(parse(shardingPolicy=policy), settings, 2)
    assert config.work_dir is not None and config.work_dir.startswith(builders.DEFAULT_WORK_DIR)
    assert (config.owner, config.owner_marker) == (None, None)
    assert "owner" not in serverconfig.to_json(config)  # unchanged pods for services without a workDir


def live_dispatcher(svc: spec.ServiceSpec, settings: BuildSettings, workers: int, work_dir: str) -> dict[str, Any]:
    config = dataclasses.replace(builders.dispatcher_config(svc, settings, workers), work_dir=work_dir)
    return {"worker_addresses": list(config.worker_addresses or ()), "work_dir": config.work_dir}


@pytest.mark.parametrize(
    ("live_workers", "live_dir", "expected"),
    [
        (2, "2-workers-g3", "2-workers-g3"),  # same list: the running journal is replayed
        (2, "2-workers", "2-workers"),  # a service from before generations keeps its journal too
        (3, "3-workers-g3", "2-workers-g7"),  # the list changes: a fresh journal
        (2, "elsewhere/2-workers-g3", "2-workers-g7"),  # not one of ours (e.g. workDir changed)
        (2, "tf_data_dispatcher_journal", "2-workers-g7"),
    ],
)
def test_a_static_dispatcher_keeps_its_journal_only_while_its_list_stays(
    settings: BuildSettings, live_workers: int, live_dir: str, expected: str
) -> None:
    svc = parse(generation=7, shardingPolicy="FILE")
    live = live_dispatcher(svc, settings, live_workers, f"{builders.DEFAULT_WORK_DIR}/{live_dir}")
    assert builders.static_journal(svc, settings, 2, live) == expected
    assert builders.static_journal(svc, settings, 2, None) == "2-workers-g7"


@pytest.mark.parametrize(
    ("work_dir", "live_dir", "expected"),
    [
        # Only the trailing '/' of the workDir goes: the journal under it is still found.
        ("/journalX/", "/journalX/2-workers-g3", "2-workers-g3"),
        # The workDir changed (to one of the same length): the old place's journal is not this one's.
        ("/new", "/old/2-workers-g3", "2-workers-g7"),
    ],
)
def test_a_static_journal_is_looked_for_under_the_work_dir_as_written(
    settings: BuildSettings, work_dir: str, live_dir: str, expected: str
) -> None:
    svc = parse(generation=7, shardingPolicy="FILE", dispatcher={"workDir": work_dir})
    assert builders.static_journal(svc, settings, 2, live_dispatcher(svc, settings, 2, live_dir)) == expected
    assert builders.dispatcher_config(svc, settings, 2, expected).work_dir == f"{work_dir.rstrip('/')}/{expected}"


def test_each_child_is_named_by_its_own_api_version_kind_and_name(settings: BuildSettings) -> None:
    # What the reconcile deletes when a child is no longer wanted: the row must name the object it built.
    svc = parse(
        shardingPolicy="DYNAMIC",
        workers={"replicas": 3, "resources": {"requests": {"cpu": "1"}}},
        autoscaling={"metric": "CPU", "maxReplicas": 4},
    )
    rows = children.render_all(svc, settings, builders.Counts(3, 3))
    assert [m["kind"] for _, (_, m) in rows if m is not None] == [
        *["Service"] * 3,
        "ConfigMap",
        *["StatefulSet"] * 2,
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "NetworkPolicy",
    ]
    for kind, (name, manifest) in rows:
        assert manifest is not None
        assert (manifest["apiVersion"], manifest["kind"], manifest["metadata"]["name"]) == (
            kind.api_version,
            kind.kind,
            name,
        )
        assert "delete" in kind.verbs or kind.kind in ("Service", "ConfigMap")  # never None: never deleted


def test_a_volume_keeps_the_lists_inside_it(settings: BuildSettings) -> None:
    items = [{"key": "a.json", "path": "a.json"}, {"key": "b.json", "path": "sub/b.json", "mode": 0o400}]
    volume = {"name": "cfg", "configMap": {"name": "settings", "items": items, "optional": False}}
    svc = parse(workers={"volumes": [volume], "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]})
    pod = builders.build_worker_statefulset(svc, settings, 2)["spec"]["template"]["spec"]
    # `optional: false` goes, as the API server drops it; the items stay, each as written.
    assert [v for v in pod["volumes"] if v["name"] == "cfg"] == [
        {"name": "cfg", "configMap": {"name": "settings", "items": items}}
    ]


def with_env(*env: dict[str, str]) -> dict[str, Any]:
    return {"spec": {"template": {"spec": {"containers": [{"env": list(env)}]}}}}


@pytest.mark.parametrize(
    ("statefulset", "expected"),
    [
        ({}, None),  # nothing to read yet
        ({"metadata": {"name": "demo-dispatcher"}}, None),  # no spec (yet)
        (with_env({"name": "OTHER", "value": "{}"}), None),
        (with_env({"name": serverconfig.CONFIG_ENV, "value": "[1]"}), None),
        (
            with_env({"name": "OTHER", "value": "not json"}, {"name": serverconfig.CONFIG_ENV, "value": '{"port": 5}'}),
            {"port": 5},
        ),
    ],
)
def test_read_config_reads_only_the_server_configuration_and_only_an_object(
    statefulset: dict[str, Any], expected: dict[str, Any] | None
) -> None:
    assert builders.read_config(statefulset) == expected


def test_a_name_at_the_length_limit_fits_every_name_kubernetes_derives_from_it(settings: BuildSettings) -> None:
    name, namespace = "n" * spec.MAX_NAME_LENGTH, "x" * 63
    doc = body(name, namespace, shardingPolicy="FILE", workers={"replicas": 1000})
    svc = spec.parse(doc, "img")
    rendered = children.render_all(svc, settings, builders.Counts(1000, 1000))
    for child in (m for _, (_, m) in rendered if m is not None):
        child_name = child["metadata"]["name"]
        assert len(child_name) <= 253, child_name
        if child["kind"] == "Service":  # a DNS-1035 label
            assert len(child_name) <= 63, child_name
        if child["kind"] == "StatefulSet":
            # Its pods are labelled controller-revision-hash=<name>-<up to 10 digits> and named
            # <name>-<ordinal>, a hostname.
            assert len(f"{child_name}-4294967295") <= 63, child_name
            last_pod = f"{child_name}-{child['spec']['replicas'] - 1}"
            assert len(last_pod) <= 63, last_pod
            for claim in child["spec"].get("volumeClaimTemplates", []):
                assert len(f"{claim['metadata']['name']}-{last_pod}") <= 253
        for value in child["metadata"]["labels"].values():
            assert len(value) <= 63, value
    for address in builders.worker_addresses(svc, settings, 1000):
        host = address.rsplit(":", 1)[0]
        assert len(host) <= 253 and all(len(part) <= 63 for part in host.split(".")), host
    assert len(builders.dispatcher_host(svc, settings)) <= 253
    # One more character and the dispatcher's revision label would not fit.
    assert len(f"{builders.dispatcher_name('n' * (spec.MAX_NAME_LENGTH + 1))}-4294967295") > 63


def test_static_workers_heartbeat_every_second_unless_the_spec_says() -> None:
    # The heartbeat bounds a static rescale: workers re-register with the restarted dispatcher on it.
    assert builders.worker_config(parse(shardingPolicy="FILE"), BuildSettings()).heartbeat_interval_ms == 1000
    assert builders.worker_config(parse(shardingPolicy="DYNAMIC"), BuildSettings()).heartbeat_interval_ms is None
    explicit = parse(shardingPolicy="HINT", workers={"heartbeatIntervalMs": 3000})
    assert builders.worker_config(explicit, BuildSettings()).heartbeat_interval_ms == 3000


# --- The user's volumes, volume mounts and environment variables ---------------------------------

DATA = {
    "volumes": [
        {"name": "tfrecords", "persistentVolumeClaim": {"claimName": "imagenet", "readOnly": True}},
        {"name": "creds", "secret": {"secretName": "s3", "optional": False, "defaultMode": 0}},
    ],
    "volumeMounts": [{"name": "tfrecords", "mountPath": "/data", "readOnly": True, "subPath": ""}],
    "env": [{"name": "AWS_REGION", "value": "eu-west-1"}, {"name": "EMPTY", "value": ""}],
    "envFrom": [{"secretRef": {"name": "s3", "optional": False}}],
}


def test_workers_mount_the_users_volumes_after_the_operators_own(settings: BuildSettings) -> None:
    sts = builders.build_worker_statefulset(parse(shardingPolicy="FILE", workers=DATA), settings, 2)
    pod = sts["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}},
        {"name": "tfrecords", "persistentVolumeClaim": {"claimName": "imagenet", "readOnly": True}},
        # optional: false means what unset means, so it is left out; mode 0 is a real mode.
        {"name": "creds", "secret": {"secretName": "s3", "defaultMode": 0}},
    ]
    assert container(sts)["volumeMounts"] == [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "tfrecords", "mountPath": "/data", "readOnly": True},
    ]
    env = container(sts)["env"]
    # The operator's first: a later variable of the same name would win (spec refuses one anyway).
    assert sorted(e["name"] for e in env[:3]) == sorted(spec.RESERVED_ENV)
    assert env[-2:] == [{"name": "AWS_REGION", "value": "eu-west-1"}, {"name": "EMPTY"}]
    assert container(sts)["envFrom"] == [{"secretRef": {"name": "s3"}}]
    # The server's own configuration is untouched by them.
    assert pod_config(sts, "worker", "demo-worker-0") == pod_config(
        builders.build_worker_statefulset(parse(shardingPolicy="FILE"), settings, 2), "worker", "demo-worker-0"
    )


def test_the_dispatcher_gets_its_own_volumes_and_env_beside_the_journal(settings: BuildSettings) -> None:
    svc = parse(dispatcher=DATA)
    sts = builders.build_dispatcher_statefulset(svc, settings, 2)
    assert [v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]] == ["tmp", "tfrecords", "creds"]
    assert [m["name"] for m in container(sts)["volumeMounts"]] == ["tmp", "journal", "tfrecords"]
    assert [e["name"] for e in container(sts)["env"]][-2:] == ["AWS_REGION", "EMPTY"]
    # The workers' pods are not the dispatcher's.
    workers = builders.build_worker_statefulset(svc, settings, 2)
    assert [v["name"] for v in workers["spec"]["template"]["spec"]["volumes"]] == ["tmp"]
    assert "envFrom" not in container(workers)


@pytest.mark.parametrize("injected", [False, True])
@pytest.mark.parametrize("journal", [True, False])
def test_the_operators_own_volumes_and_env_are_what_spec_reserves(
    settings: BuildSettings, journal: bool, injected: bool
) -> None:
    """spec refuses a user's volume, mount or variable that collides with these: the two lists are one."""
    image = {"image": "example.com/trainer:1"} if injected else {}
    svc = parse(dispatcher={} if journal else {"workDir": "gs://b/j", "storage": {"enabled": False}}, **image)
    assert svc.inject_server is injected
    for sts, own in [
        (
            builders.build_dispatcher_statefulset(svc, settings, 2),
            spec.operator_volumes(journal=journal, program=injected),
        ),
        (builders.build_worker_statefulset(svc, settings, 2), spec.operator_volumes(journal=False, program=injected)),
    ]:
        template = sts["spec"]["template"]["spec"]
        claims = [c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])]
        assert sorted([v["name"] for v in template["volumes"]] + claims) == sorted(own)
        assert {m["name"]: m["mountPath"] for m in container(sts)["volumeMounts"]} == own
        # The injected program's defaults (HOME, ...) are not reserved: a user's variable replaces each.
        defaults = {name for name, _ in builders.INJECTED_ENV} if injected else set()
        assert sorted(e["name"] for e in container(sts)["env"] if e["name"] not in defaults) == sorted(
            spec.RESERVED_ENV
        )


def test_the_snapshots_claim_is_mounted_at_the_directory_in_the_dispatcher_and_every_worker(
    settings: BuildSettings,
) -> None:
    snapshots = {"directory": "/shared/snapshots/", "volume": {"claimName": "shared-data"}}
    svc = parse(shardingPolicy="DYNAMIC", snapshots=snapshots)
    for sts, journal in [
        (builders.build_dispatcher_statefulset(svc, settings, 2), True),
        (builders.build_worker_statefulset(svc, settings, 2), False),
    ]:
        template = sts["spec"]["template"]["spec"]
        assert {"name": "snapshots", "persistentVolumeClaim": {"claimName": "shared-data"}} in template["volumes"]
        assert {"name": "snapshots", "mountPath": "/shared/snapshots"} in container(sts)["volumeMounts"]
        # The same list spec reserves against the user's volumes and mounts.
        own = spec.operator_volumes(journal=journal, snapshots=svc.snapshots)
        assert {m["name"]: m["mountPath"] for m in container(sts)["volumeMounts"]} == own


@pytest.mark.parametrize("snapshots", [None, {"directory": "gs://bucket/tfdata"}, {"directory": "/mnt/nfs"}])
def test_without_a_snapshots_volume_the_pods_mount_nothing_more(settings: BuildSettings, snapshots: Any) -> None:
    svc = parse(shardingPolicy="DYNAMIC", **({"snapshots": snapshots} if snapshots else {}))
    plain = parse(shardingPolicy="DYNAMIC")
    assert builders.build_worker_statefulset(svc, settings, 2) == builders.build_worker_statefulset(plain, settings, 2)
    dispatcher = builders.build_dispatcher_statefulset(svc, settings, 2)
    plain_dispatcher = builders.build_dispatcher_statefulset(plain, settings, 2)
    assert dispatcher["spec"]["template"]["spec"]["volumes"] == plain_dispatcher["spec"]["template"]["spec"]["volumes"]
    assert container(dispatcher)["volumeMounts"] == container(plain_dispatcher)["volumeMounts"]
    # Only the dispatcher's configuration differs: the directory its /v1/snapshots is confined to.
    config = pod_config(dispatcher, "dispatcher", "demo-dispatcher-0")
    assert isinstance(config, serverconfig.DispatcherServerConfig)
    assert config.snapshot_dir == (snapshots["directory"] if snapshots else None)
    assert dataclasses.replace(config, snapshot_dir=None) == pod_config(plain_dispatcher, "dispatcher", "x")


# A bucket's root as the edge: "/" holds the dispatcher's journal, so it is refused.
@pytest.mark.parametrize("directory", ["/shared/snapshots/", "gs://bucket/tfdata", "gs://bucket"])
def test_the_dispatcher_serves_the_paths_the_operator_and_the_trainers_ask_for(
    settings: BuildSettings, directory: str
) -> None:
    volume = {"volume": {"claimName": "shared-data"}} if directory == "/shared/snapshots/" else {}
    svc = parse(shardingPolicy="DYNAMIC", snapshots={"directory": directory, **volume})
    assert svc.snapshots is not None
    config = pod_config(builders.build_dispatcher_statefulset(svc, settings, 2), "dispatcher", "demo-dispatcher-0")
    assert isinstance(config, serverconfig.DispatcherServerConfig) and config.snapshot_dir == directory
    operator_path = snapshotapi.SnapshotSpec("ml", "v3", "demo", "_v3").path(svc.snapshots)
    published = builders.client_settings(svc, settings).snapshot_dir
    assert published is not None
    trainer_path = client_snapshots.resolve("v3", snapshot_dir=published, environ={}, directory="/nonexistent").path
    for path in (operator_path, trainer_path):
        assert wire_snapshots.confined(path, config.snapshot_dir) == path
    with pytest.raises(wire_snapshots.PathRefused, match=f"serves only {directory.rstrip('/')}/<name>"):
        wire_snapshots.confined(trainer_path + "/chunks", config.snapshot_dir)


@pytest.mark.parametrize(
    ("image", "program", "injected"),
    [
        ("tfdata-server:test", "Auto", False),  # the operator's own server image
        ("python-tf:2.16", "Auto", True),  # any other image: the program is brought in
        ("python-tf:2.16", "FromImage", False),  # an image built from ours says so
        ("tfdata-server:test", "Injected", True),
    ],
)
def test_the_server_program_is_injected_into_an_image_of_the_users(
    image: str, program: str, injected: bool, settings: BuildSettings
) -> None:
    svc = parse(image=image, serverProgram=program, shardingPolicy="FILE")
    for sts in (
        builders.build_dispatcher_statefulset(svc, settings, worker_count=2),
        builders.build_worker_statefulset(svc, settings, replicas=2),
    ):
        pod = sts["spec"]["template"]["spec"]
        c = container(sts)
        assert c["image"] == image
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        if not injected:
            assert c["command"] == ["tfdata-server"]
            assert "initContainers" not in pod
            assert serverconfig.INJECT_MOUNT not in mounts
            continue
        assert c["command"] == ["python3", serverconfig.INJECTED_PROGRAM]
        (init,) = pod["initContainers"]
        assert init["image"] == settings.injector_image
        assert init["command"] == [
            "python3",
            "-m",
            serverconfig.INJECT_MODULE,
            serverconfig.INJECT_MOUNT,
        ]
        assert init["volumeMounts"] == [
            {
                "name": builders.PROGRAM_VOLUME,
                "mountPath": serverconfig.INJECT_MOUNT,
                "readOnly": False,
            }
        ]
        # The server reads the program it cannot change; both run under the pod's restricted context.
        assert mounts[serverconfig.INJECT_MOUNT]["readOnly"] is True
        assert init["securityContext"] == c["securityContext"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["HOME"] == spec.TMP_MOUNT  # a user's image may have a HOME the server cannot write
        assert builders.PROGRAM_VOLUME in {v["name"] for v in pod["volumes"]}


@pytest.mark.parametrize("name", [name for name, _ in builders.INJECTED_ENV])
def test_a_users_variable_replaces_the_operators_default_of_the_same_name(settings: BuildSettings, name: str) -> None:
    """On an image of the user's the operator sets HOME, KERAS_HOME and PYTHONUNBUFFERED; a user's
    variable of the same name is the pod's one entry (two would be refused by server-side apply)."""
    own = {"name": name, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    svc = parse(image="python-tf:2.16", workers={"env": [own]}, dispatcher={"env": [own]})
    assert svc.inject_server
    build = (builders.build_worker_statefulset, builders.build_dispatcher_statefulset)
    for sts in (b(svc, settings, 2) for b in build):
        env = container(sts)["env"]
        assert [e for e in env if e["name"] == name] == [own]
        names = [e["name"] for e in env]
        assert len(names) == len(set(names)), names
        # The other defaults stay.
        assert {n for n, _ in builders.INJECTED_ENV} - {name} <= set(names)


def test_preloads_reach_the_dispatcher_and_every_worker(
    settings: BuildSettings,
) -> None:
    svc = parse(
        preload={
            "modules": ["tensorflow_text", "my.ops"],
            "opLibraries": ["/opt/ops/lib.so"],
        }
    )
    configs = [
        pod_config(
            builders.build_dispatcher_statefulset(svc, settings, worker_count=2),
            "dispatcher",
            "demo-dispatcher-0",
        ),
        pod_config(
            builders.build_worker_statefulset(svc, settings, replicas=2),
            "worker",
            "demo-workers-0",
        ),
    ]
    for config in configs:
        assert config.preload_modules == ("tensorflow_text", "my.ops")
        assert config.preload_op_libraries == ("/opt/ops/lib.so",)


def test_dynamic_jobs_are_collected_unless_the_spec_says_otherwise(settings: BuildSettings) -> None:
    default = pod_config(builders.build_dispatcher_statefulset(parse(), settings, 2), "dispatcher", "x")
    assert default.gc_dynamic_sharding_jobs is None  # left to the server program, whose default collects them
    assert serverconfig.setting(default, "gc_dynamic_sharding_jobs") is True
    kept = parse(dispatcher={"gcDynamicShardingJobs": False})
    assert kept.dispatcher.gc_dynamic_sharding_jobs is False
    with pytest.raises(spec.SpecError, match="gcDynamicShardingJobs must be true or false"):
        parse(dispatcher={"gcDynamicShardingJobs": "no"})
