"""The NetworkPolicy of spec.networkPolicy: who may reach the servers, and where they may connect."""

from __future__ import annotations

import ipaddress

from tfdata_operator.api.identity import CLIENT_LABEL
from tfdata_operator.api.spec import TFDATA_METRIC, ServiceSpec
from tfdata_operator.render.names import instance_labels, metadata, network_policy_name
from tfdata_operator.render.settings import BuildSettings, Manifest


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
        "metadata": metadata(svc, network_policy_name(svc), "network-policy"),
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
