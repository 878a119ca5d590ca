"""The dev cluster: a real Kubernetes control plane on 127.0.0.1 and, on demand, a node that
runs pods as local processes, for development and the test tiers.

What it gives that kind cannot: no container runtime, images, registry or Docker. etcd,
kube-apiserver, kube-controller-manager and kube-scheduler (the pinned binaries of
devcluster/k8s-binaries.sh) run as plain processes, and the node agent (`devcluster.node`) runs
each pod's containers as processes of the project's venv, each pod in a network namespace of its
own with an IP on a bridge, its volumes bind-mounted and its CPU limits in a cgroup. A cluster with
its node is up in seconds; a change to the operator or to `tfdata-server` is in the next pod that
starts, with no image to build or load; and the tests reach every pod by its Service or pod name
from a network namespace of their own (`node.client_netns`) and read container logs as files.

What it costs: the node is not a kubelet. It enforces no isolation beyond network, mounts and CPU
(no images, users, securityContext or memory limits), has no kube-proxy and no DNS (hosts files
stand in for both: a Service's port must equal its targetPort), no kubelet API (`kubectl
logs/exec/port-forward`), and it needs root; and its ~1,600 lines are the project's to keep
right. What only a real kubelet and container runtime show is tested on kind (kind/, tests/kind).

Why keep it next to kind (docs/development.md, "The node agent next to kind", has the figures, from
this project's 2-core machine): a cluster with its node is up and down in 10.5 s, against 1m35s on
kind with warm caches; from nothing, 8 minutes of binaries against about 33 (kind's node image alone
is 15); and kind needs the images rebuilt and loaded after every change. On kind the e2e tier's
clients, which run in the pod network through `node.client_netns`, would have to become pods, its
datasets be mounted into the node, and its services fit one 2-core node.

    python -m devcluster up [--node | --kwok-nodes N] [--state-dir DIR]   # make dev-cluster
    python -m devcluster down [--state-dir DIR]                           # make dev-cluster-down
    eval "$(python -m devcluster env)"

Modules: `controlplane` (the components, `up`, `down`, kwok's fake nodes), `node` (the node
agent, `python -m devcluster.node run|client|cleanup`), `demo` (`make demo`); kwok/ holds kwok's
Stages, and the two scripts build the pinned binaries. Callers use what this module exports.
"""

from __future__ import annotations

from . import node
from .controlplane import (
    AUDIT_POLICY,
    COMPONENTS,
    COMPONENTS_WITH_NODE,
    DEFAULT_STATE_DIR,
    KWOK_NODE_ANNOTATION,
    KWOK_TAINT,
    KWOK_TOLERATION,
    NODE_AGENT,
    NODE_NAME,
    Cluster,
    ClusterError,
    Component,
    Context,
    condition_is_true,
    down,
    ensure_binaries,
    install_crds,
    is_kwok_node,
    kwok_node,
    kwok_node_names,
    main,
    missing_binaries,
    running,
    up,
    wait_condition,
    with_kwok,
)

__all__ = [
    "AUDIT_POLICY",
    "COMPONENTS",
    "COMPONENTS_WITH_NODE",
    "DEFAULT_STATE_DIR",
    "KWOK_NODE_ANNOTATION",
    "KWOK_TAINT",
    "KWOK_TOLERATION",
    "NODE_AGENT",
    "NODE_NAME",
    "Cluster",
    "ClusterError",
    "Component",
    "Context",
    "condition_is_true",
    "down",
    "ensure_binaries",
    "install_crds",
    "is_kwok_node",
    "kwok_node",
    "kwok_node_names",
    "main",
    "missing_binaries",
    "node",
    "running",
    "up",
    "wait_condition",
    "with_kwok",
]
