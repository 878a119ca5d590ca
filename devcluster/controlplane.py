#!/usr/bin/env python3
"""A real Kubernetes control plane on 127.0.0.1, for development and integration tests.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler (the pinned
versions devcluster/k8s-binaries.sh provides) run as plain background processes: no
containers and no nodes, so Pods are created and stay Pending until a node
agent joins. Everything lives in one state directory (default `.local/`):

    kubeconfig          admin kubeconfig (user `admin`, group system:masters)
    cluster.json        API server URL, ports and bin dir of the running cluster
    pki/                CAs, certificates, service-account key, tokens, component kubeconfigs
    etcd/               etcd data
    run/<component>.pid
    logs/<component>.log

    python -m devcluster up   [--state-dir DIR]   # start; a no-op if already healthy
    python -m devcluster up --kwok-nodes N        # ... with N kwok nodes (see `with_kwok`)
    python -m devcluster down [--state-dir DIR]   # stop, delete all of the above but logs/
    eval "$(python -m devcluster env)"            # KUBECONFIG and PATH for this shell

From Python (the integration-test fixtures): `up(state_dir) -> Cluster`, `down(state_dir)`.
A further process (e.g. a node agent, or kwok: `with_kwok(n)`) joins by appending
a `Component` to the list passed to `up`.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
DEFAULT_STATE_DIR = REPO / ".local"
BINARIES_SCRIPT = REPO / "devcluster" / "k8s-binaries.sh"
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "helm", "kwok")

SERVICE_CIDR = "10.96.0.0/16"
# The `kubernetes` Service gets the first address of SERVICE_CIDR; in-cluster
# clients verify the serving cert against it.
KUBERNETES_SERVICE_IP = "10.96.0.1"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"

# What `up` creates in the state dir and `down` deletes. Anything else there
# (logs/, other clusters' state dirs such as test-cluster-*) is left alone.
MANAGED = ("cluster.json", "kubeconfig", "pki", "etcd", "run", "node")
STOP_GRACE_SECONDS = 10.0

# Popen objects of the components this process started, so that stopping them
# reaps them (a zombie would look alive) and Python does not warn about them.
_children: dict[int, subprocess.Popen[bytes]] = {}


class ClusterError(RuntimeError):
    """The cluster could not be started (the message says which component and shows its log), or
    an object in it did not reach the state waited for (the message shows what was seen)."""


def _say(msg: str) -> None:
    print(f"[devcluster] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Cluster:
    """How to reach a running cluster."""

    kubeconfig: Path
    server: str
    bin_dir: Path
    state_dir: Path | None = None  # None: a cluster this module did not start (kind, ...)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path, bin_dir: Path) -> Cluster:
        """An existing cluster, reached through the current context of `kubeconfig`."""
        config = yaml.safe_load(Path(kubeconfig).read_text())
        context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
        server = next(c["cluster"]["server"] for c in config["clusters"] if c["name"] == context["cluster"])
        return cls(kubeconfig=Path(kubeconfig).resolve(), server=server, bin_dir=bin_dir)

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for subprocesses (kubectl, helm, the operator) that must use this cluster."""
        env = dict(os.environ if base is None else base)
        # kopf and the kubernetes client try in-cluster credentials first when these are set.
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env.pop("KUBERNETES_SERVICE_PORT", None)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env


@dataclass
class Context:
    """What a component needs to build its command line and to probe itself."""

    state_dir: Path
    bin_dir: Path
    ports: dict[str, int] = field(default_factory=dict)

    def port(self, name: str) -> int:
        """A free port on 127.0.0.1 for `name`, the same one on every call."""
        if name not in self.ports:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.ports[name] = s.getsockname()[1]
        return self.ports[name]

    def bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    def pki(self, name: str) -> str:
        return str(self.state_dir / "pki" / name)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port('kube-apiserver')}"


@dataclass(frozen=True)
class Component:
    """One process of the cluster: `up` starts them in order and waits until `ready`."""

    name: str
    command: Callable[[Context], list[str]]
    ready: Callable[[Context], bool]  # one quick probe; polled until it passes
    timeout: float = 60.0
    # Run once before the process starts (the API server is up by then), e.g. to create its objects.
    setup: Callable[[Context], None] | None = None


# --- Probes -----------------------------------------------------------------


def _get(url: str, cafile: str | None = None, token: str | None = None) -> str | None:
    """Body of a 200 response, else None: probes are polled, so any error means "not yet"."""
    tls = ssl.create_default_context(cafile=cafile)
    if cafile is None:  # controller-manager and scheduler serve self-signed certs
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    # No proxies: an http(s)_proxy from the environment must not see 127.0.0.1.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls))
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with opener.open(request, timeout=3) as response:
            body: bytes = response.read()
            return body.decode()
    except (OSError, http.client.HTTPException):
        return None


def _etcd_ready(ctx: Context) -> bool:
    return '"health":"true"' in (_get(f"http://127.0.0.1:{ctx.port('etcd')}/health") or "")


def _apiserver_ready(ctx: Context) -> bool:
    # /readyz passes only after the post-start hooks (bootstrap RBAC, priority classes) ran.
    return _get(f"{ctx.server}/readyz", ctx.pki("ca.crt")) == "ok"


def _healthz(name: str) -> Callable[[Context], bool]:
    return lambda ctx: _get(f"https://127.0.0.1:{ctx.port(name)}/healthz") == "ok"


# --- Components ---------------------------------------------------------------


def _etcd(ctx: Context) -> list[str]:
    url = f"http://127.0.0.1:{ctx.port('etcd')}"
    return [
        ctx.bin("etcd"),
        f"--data-dir={ctx.state_dir / 'etcd'}",
        f"--listen-client-urls={url}",
        f"--advertise-client-urls={url}",
        "--listen-peer-urls=http://localhost:0",  # single member: no peers, any port
        "--unsafe-no-fsync",  # throwaway data; fsync dominates etcd latency on slow disks
        "--log-level=warn",
    ]


def _kube_apiserver(ctx: Context) -> list[str]:
    return [
        ctx.bin("kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{ctx.port('etcd')}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ctx.port('kube-apiserver')}",
        # A loopback advertise address is rejected for the `kubernetes` Endpoints
        # unless nothing reconciles them.
        "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none",
        f"--tls-cert-file={ctx.pki('apiserver.crt')}",
        f"--tls-private-key-file={ctx.pki('apiserver.key')}",
        f"--cert-dir={ctx.pki('')}",  # unused with the files above; keeps it out of /var/run
        # Tokens for admin and the components; client certs signed by ca.key also
        # work (e.g. CN=system:node:<name>, O=system:nodes for a node agent).
        f"--token-auth-file={ctx.pki('tokens.csv')}",
        f"--client-ca-file={ctx.pki('ca.crt')}",
        f"--requestheader-client-ca-file={ctx.pki('front-proxy-ca.crt')}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={ctx.pki('front-proxy-client.crt')}",
        f"--proxy-client-key-file={ctx.pki('front-proxy-client.key')}",
        "--enable-aggregator-routing=true",  # no kube-proxy: reach aggregated APIs at their endpoints
        "--authorization-mode=Node,RBAC",
        # On top of the defaults: NodeRestriction as kubeadm does; OwnerReferencesPermissionEnforcement
        # so an identity may set blockOwnerDeletion only where it may update finalizers, as the chart's RBAC must allow.
        "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement",
        "--allow-privileged=true",
        f"--service-account-issuer={SA_ISSUER}",
        f"--service-account-key-file={ctx.pki('sa.pub')}",
        f"--service-account-signing-key-file={ctx.pki('sa.key')}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        *_audit_flags(ctx),
    ]


# A benchmark that counts who asks the API server what writes an audit policy here before `up`.
AUDIT_POLICY = "audit-policy.yaml"


def _audit_flags(ctx: Context) -> list[str]:
    policy = ctx.state_dir / AUDIT_POLICY
    if not policy.exists():
        return []
    return [f"--audit-policy-file={policy}", f"--audit-log-path={ctx.state_dir / 'logs' / 'audit.log'}",
            "--audit-log-format=json", "--audit-log-mode=batch"]  # fmt: skip


def _kube_controller_manager(ctx: Context) -> list[str]:
    kubeconfig = ctx.pki("kube-controller-manager.kubeconfig")
    return [
        ctx.bin("kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ctx.port('kube-controller-manager')}",
        "--leader-elect=false",
        "--controllers=*",
        # Each controller acts as its own ServiceAccount, as on kubeadm clusters,
        # so the bootstrap RBAC roles are what is exercised.
        "--use-service-account-credentials=true",
        f"--root-ca-file={ctx.pki('ca.crt')}",
        f"--service-account-private-key-file={ctx.pki('sa.key')}",
        f"--cluster-signing-cert-file={ctx.pki('ca.crt')}",  # CSRs get signed
        f"--cluster-signing-key-file={ctx.pki('ca.key')}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
    ]


def _kube_scheduler(ctx: Context) -> list[str]:
    kubeconfig = ctx.pki("kube-scheduler.kubeconfig")
    return [
        ctx.bin("kube-scheduler"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ctx.port('kube-scheduler')}",
        "--leader-elect=false",
    ]


COMPONENTS: tuple[Component, ...] = (
    Component("etcd", _etcd, _etcd_ready, timeout=30),
    Component("kube-apiserver", _kube_apiserver, _apiserver_ready, timeout=120),
    Component("kube-controller-manager", _kube_controller_manager, _healthz("kube-controller-manager")),
    Component("kube-scheduler", _kube_scheduler, _healthz("kube-scheduler")),
)


# --- Node (devcluster.node): pods run as local processes ---------------------------
# Opt-in: `up(state_dir, COMPONENTS_WITH_NODE)` or `up --node`. Without it the cluster
# has no node, as the integration tests expect.

NODE_NAME = "tfdata-dev-node"


def _node_agent(ctx: Context) -> list[str]:
    # The project's venv: the agent needs the kubernetes client, its pods `tfdata-server`.
    venv_python = REPO / ".venv" / "bin" / "python"
    python = str(venv_python) if venv_python.exists() else sys.executable
    return [python, "-m", "devcluster.node", "run", f"--state-dir={ctx.state_dir}", f"--node-name={NODE_NAME}"]


def _admin_get(ctx: Context, path: str) -> Any:
    """A GET as the admin identity, parsed; None on any error (probes are polled)."""
    config = yaml.safe_load((ctx.state_dir / "kubeconfig").read_text())
    body = _get(f"{ctx.server}{path}", ctx.pki("ca.crt"), config["users"][0]["user"]["token"])
    return json.loads(body) if body is not None else None


def _node_ready(ctx: Context) -> bool:
    node = _admin_get(ctx, f"/api/v1/nodes/{NODE_NAME}")
    return node is not None and _is_ready(node)


def _is_ready(node: Mapping[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


NODE_AGENT = Component("node-agent", _node_agent, _node_ready, timeout=60)
COMPONENTS_WITH_NODE: tuple[Component, ...] = (*COMPONENTS, NODE_AGENT)


# --- kwok (sigs.k8s.io/kwok): fake nodes whose pods turn Ready without running ----------
# Opt-in: `up(state_dir, with_kwok(n))` or `up --kwok-nodes N`. kwok is a simulated
# kubelet: it writes the status a kubelet writes (Running, Ready, containerStatuses, pod
# IPs; a deleted pod goes), following the Stages in devcluster/kwok/stages.yaml. Its nodes
# carry KWOK_TAINT, so only pods that tolerate it (KWOK_TOLERATION) go there and every
# other pod stays Pending as on a cluster without nodes.

KWOK_DIR = REPO / "devcluster" / "kwok"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"  # kwok manages the nodes annotated with it (value "fake")
KWOK_TAINT = {"key": KWOK_NODE_ANNOTATION, "value": "fake", "effect": "NoSchedule"}
KWOK_TOLERATION = {"key": KWOK_NODE_ANNOTATION, "operator": "Exists", "effect": "NoSchedule"}
# kwok hands out pod IPs from one pool (the nodes have no podCIDR): room for 65k pods, apart from SERVICE_CIDR,
# in the range set aside for benchmarks (RFC 2544), which no real network uses. Nothing answers at
# those addresses, and the operator does ask pods (their /readyz, /serverinfo): an unreachable route
# makes such a request fail at once, on this machine, instead of leaving it for the default gateway.
KWOK_POD_CIDR = "198.18.0.0/16"
KWOK_NODE_LABELS = {"type": "kwok"}  # what the readiness probe lists them by
KWOK_CAPACITY = {"cpu": "1k", "memory": "1Ti", "pods": "1M", "ephemeral-storage": "1Pi"}


def kwok_node_names(count: int) -> list[str]:
    return [f"kwok-node-{i}" for i in range(count)]


def is_kwok_node(node: Mapping[str, Any]) -> bool:
    """Whether a Node object is one of kwok's fake nodes (no kubelet runs its pods)."""
    return bool(node.get("metadata", {}).get("annotations", {}).get(KWOK_NODE_ANNOTATION) == "fake")


def kwok_node(name: str) -> dict[str, Any]:
    """A Node that kwok takes over (by its annotation), tainted so that only pods tolerating KWOK_TAINT go there."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **KWOK_NODE_LABELS},
        },
        "spec": {"taints": [KWOK_TAINT]},
        # kwok's defaults (its Stage's) lack ephemeral-storage, and the scheduler then places no pod that
        # requests any: every tf.data server does (its /tmp). kwok keeps a capacity the Node was created with.
        "status": {"capacity": KWOK_CAPACITY, "allocatable": KWOK_CAPACITY},
    }


def _kwok_objects(count: int) -> list[dict[str, Any]]:
    nodes = [kwok_node(name) for name in kwok_node_names(count)]
    storage_class: dict[str, Any] = yaml.safe_load((KWOK_DIR / "storage-class.yaml").read_text())
    return [*nodes, storage_class]


def _kwok_setup(count: int) -> Callable[[Context], None]:
    def setup(ctx: Context) -> None:
        route = ["ip", "route", "replace", "unreachable", KWOK_POD_CIDR]
        routed = subprocess.run(route, check=False, capture_output=True, text=True, timeout=10)
        if routed.returncode != 0:
            raise ClusterError(
                f"`{' '.join(route)}` failed ({routed.stderr.strip()}): kwok's pod IPs must not reach the network; "
                "run as root"
            )
        # kwok registers no node of its own: it takes over the nodes annotated for it.
        manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": _kwok_objects(count)})
        kubectl = [ctx.bin("kubectl"), "--kubeconfig", str(ctx.state_dir / "kubeconfig"), "apply", "-f", "-"]
        result = subprocess.run(kubectl, input=manifest, check=False, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise ClusterError(f"creating kwok's nodes failed:\n{result.stderr}")

    return setup


def _kwok(ctx: Context) -> list[str]:
    return [
        ctx.bin("kwok"),
        f"--config={KWOK_DIR / 'stages.yaml'}",
        # The admin identity: kwok writes node and pod status, deletes pods and creates volumes.
        f"--kubeconfig={ctx.state_dir / 'kubeconfig'}",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
        f"--cidr={KWOK_POD_CIDR}",
        # Renew each node's Lease as a kubelet does (kwok's own default, 0, renews none; kwokctl passes 40).
        # Without it the node lifecycle controller finds the nodes unreachable within a minute, marks
        # their pods not Ready, and kwok's pod-ready Stage (for Pending pods only) never undoes that.
        "--node-lease-duration-seconds=40",
    ]


def with_kwok(nodes: int, base: Sequence[Component] = COMPONENTS) -> tuple[Component, ...]:
    """`base` and kwok with `nodes` fake nodes (tainted: see KWOK_TOLERATION)."""
    if nodes < 1:
        raise ClusterError(f"kwok needs at least one node, not {nodes}")

    def all_ready(ctx: Context) -> bool:
        selector = ",".join(f"{k}={v}" for k, v in KWOK_NODE_LABELS.items())
        listed = _admin_get(ctx, f"/api/v1/nodes?labelSelector={urllib.parse.quote(selector)}")
        return listed is not None and sum(map(_is_ready, listed["items"])) == nodes

    return (*base, Component("kwok", _kwok, all_ready, timeout=60 + nodes / 20, setup=_kwok_setup(nodes)))


# --- Binaries, certificates, credentials ----------------------------------------


def missing_binaries() -> list[str]:
    """The binaries devcluster/k8s-binaries.sh has yet to provide (it is not run to build them)."""
    printed = subprocess.run([str(BINARIES_SCRIPT), "--print"], check=True, capture_output=True, text=True)
    bin_dir = Path(printed.stdout.strip().splitlines()[-1])
    return [b for b in REQUIRED_BINARIES if not (bin_dir / b).exists()]


def ensure_binaries() -> Path:
    """The bin dir of devcluster/k8s-binaries.sh, building the binaries first if needed."""
    missing = missing_binaries()
    if missing:
        _say(f"{', '.join(missing)} not built yet: building from source.")
        _say("A cold build takes 15-40 minutes on 2 cores and several GB of cache; progress follows.")
    # stderr (the script's progress) goes straight to the user; stdout ends with the bin dir.
    built = subprocess.run([str(BINARIES_SCRIPT)], check=False, stdout=subprocess.PIPE, text=True)
    if built.returncode != 0:
        raise ClusterError(f"devcluster/k8s-binaries.sh failed (exit {built.returncode}); see its output above")
    return Path(built.stdout.strip().splitlines()[-1])


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args[:2])} failed:\n{result.stderr}")


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _kubeconfig(server: str, ca_file: str, user: str, token: str) -> str:
    ca_data = base64.b64encode(Path(ca_file).read_bytes()).decode()
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "tfdata-dev", "cluster": {"server": server, "certificate-authority-data": ca_data}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "tfdata-dev", "context": {"cluster": "tfdata-dev", "user": user}}],
            "current-context": "tfdata-dev",
        }
    )


def _make_ca(pki: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "3650",
        "-keyout", str(pki / f"{name}.key"), "-out", str(pki / f"{name}.crt"), "-subj", f"/CN=tfdata-devcluster-{name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )  # fmt: skip


def _make_cert(pki: Path, name: str, ca: str, extensions: str) -> None:
    """`name`.crt and .key, signed by `ca`, with CN `name` and the given openssl extensions."""
    key, csr, crt, ext = (str(pki / f"{name}.{suffix}") for suffix in ("key", "csr", "crt", "ext"))
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", csr, "-subj", f"/CN={name}",
    )  # fmt: skip
    Path(ext).write_text(f"keyUsage=critical,digitalSignature\n{extensions}\n")
    _openssl(
        "x509", "-req", "-in", csr, "-CA", str(pki / f"{ca}.crt"), "-CAkey", str(pki / f"{ca}.key"),
        "-set_serial", str(secrets.randbits(63)), "-days", "3650", "-extfile", ext, "-out", crt,
    )  # fmt: skip


def _make_pki(ctx: Context) -> dict[str, str]:
    """CAs, certificates, the service-account key, and a token and kubeconfig per identity.

    Returns the tokens by identity ("admin", "kube-controller-manager", "kube-scheduler").
    """
    pki = ctx.state_dir / "pki"
    pki.mkdir(mode=0o700, parents=True, exist_ok=True)
    _make_ca(pki, "ca")
    names = ["kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"]
    sans = ",".join(["IP:127.0.0.1", "DNS:localhost", f"IP:{KUBERNETES_SERVICE_IP}", *(f"DNS:{n}" for n in names)])
    _make_cert(pki, "apiserver", "ca", f"extendedKeyUsage=serverAuth\nsubjectAltName={sans}")
    # API aggregation (e.g. a metrics API for the HPA) proxies requests with a
    # client cert from its own CA; the controller-manager and scheduler also
    # expect that CA to be published, and log errors every few seconds without it.
    _make_ca(pki, "front-proxy-ca")
    _make_cert(pki, "front-proxy-client", "front-proxy-ca", "extendedKeyUsage=clientAuth")
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", ctx.pki("sa.key"))
    _openssl("pkey", "-in", ctx.pki("sa.key"), "-pubout", "-out", ctx.pki("sa.pub"))

    # The identities a kubeadm cluster uses, so the bootstrap RBAC bindings apply.
    identities = {
        "admin": ("admin", "system:masters"),
        "kube-controller-manager": ("system:kube-controller-manager", ""),
        "kube-scheduler": ("system:kube-scheduler", ""),
    }
    tokens = {name: secrets.token_hex(24) for name in identities}
    # token,user,uid[,"group,..."]: an empty groups column would add the group "".
    rows = [
        f"{tokens[n]},{user},{user}" + (f',"{groups}"' if groups else "") for n, (user, groups) in identities.items()
    ]
    _write_private(pki / "tokens.csv", "\n".join(rows) + "\n")
    for name, (user, _) in identities.items():
        config = _kubeconfig(ctx.server, ctx.pki("ca.crt"), user, tokens[name])
        _write_private(ctx.state_dir / "kubeconfig" if name == "admin" else pki / f"{name}.kubeconfig", config)
    return tokens


# --- Processes ------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)  # readers never see half a file


def _is_ours(pid: int, argv0: str) -> bool:
    """Whether `pid` is alive and still runs `argv0`, i.e. was not reused by another program."""
    child = _children.get(pid)
    if child is not None and child.poll() is not None:  # reaps it
        del _children[pid]
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return cmdline.split(b"\0")[0].decode(errors="replace") == argv0  # a zombie has an empty cmdline


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"(no log at {path})"
    return f"--- last {len(text)} lines of {path} ---\n" + "\n".join(text)


def _component_env() -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH: the node agent
    runs as `python -m devcluster.node` in the state dir, and imports this checkout's package."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _start(component: Component, ctx: Context) -> None:
    if component.setup is not None:
        component.setup(ctx)
    argv = component.command(ctx)
    log = ctx.state_dir / "logs" / f"{component.name}.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        # A new session: the cluster outlives `make dev-cluster`, and Ctrl-C in the
        # terminal does not reach it.
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ctx.state_dir,
            env=_component_env(),
            start_new_session=True,
        )
    _children[proc.pid] = proc
    pidfile = ctx.state_dir / "run" / f"{component.name}.pid"
    _write_json(pidfile, {"pid": proc.pid, "argv0": argv[0], "started": time.time()})
    deadline = started + component.timeout
    while not component.ready(ctx):
        if proc.poll() is not None:
            raise ClusterError(f"{component.name} exited with code {proc.returncode} during start\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{component.name} not ready after {component.timeout:.0f}s\n{_tail(log)}")
        time.sleep(0.2)
    _say(f"{component.name} ready in {time.monotonic() - started:.1f}s (pid {proc.pid}, log {log})")


def _stop(pidfile: Path) -> None:
    info = _read_json(pidfile)
    if info is None:
        return
    pid, argv0, name = info["pid"], info["argv0"], pidfile.stem
    if not _is_ours(pid, argv0):
        return  # gone already, or the pid now belongs to something else: never signal that
    # The process leads its own group (start_new_session): signal the group, so
    # anything it spawned (a node agent's pods) goes too.
    os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while _is_ours(pid, argv0) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _is_ours(pid, argv0):
        _say(f"{name} (pid {pid}) ignored SIGTERM for {STOP_GRACE_SECONDS:.0f}s; sending SIGKILL")
        os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while _is_ours(pid, argv0) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _is_ours(pid, argv0):
            raise ClusterError(f"{name} (pid {pid}) survived SIGKILL; stop it by hand")
    _say(f"stopped {name} (pid {pid})")


# --- Public API -----------------------------------------------------------------


def running(state_dir: Path = DEFAULT_STATE_DIR, components: Sequence[Component] = COMPONENTS) -> Cluster | None:
    """The cluster in `state_dir` if every component runs and is healthy, else None."""
    state_dir = Path(state_dir).resolve()
    info = _read_json(state_dir / "cluster.json")
    if info is None:
        return None
    ctx = Context(state_dir, Path(info["bin_dir"]), dict(info["ports"]))
    for component in components:
        pid = _read_json(state_dir / "run" / f"{component.name}.pid")
        if pid is None or not _is_ours(pid["pid"], pid["argv0"]) or not component.ready(ctx):
            return None
    return Cluster(kubeconfig=state_dir / "kubeconfig", server=info["server"], bin_dir=ctx.bin_dir, state_dir=state_dir)


def up(state_dir: Path = DEFAULT_STATE_DIR, components: Sequence[Component] = COMPONENTS) -> Cluster:
    """Start a cluster in `state_dir` (or return the healthy one already there)."""
    state_dir = Path(state_dir).resolve()
    cluster = running(state_dir, components)
    if cluster is not None:
        _say(f"already running and healthy: {cluster.server}")
        return cluster
    if any((state_dir / name).exists() for name in MANAGED):
        _say(f"replacing a stopped or unhealthy cluster in {state_dir}")
        down(state_dir)

    ctx = Context(state_dir, ensure_binaries())
    started = time.monotonic()
    for d in ("logs", "run"):
        (state_dir / d).mkdir(parents=True, exist_ok=True)
    try:
        tokens = _make_pki(ctx)
        for component in components:
            _start(component, ctx)
        cluster = Cluster(
            kubeconfig=state_dir / "kubeconfig", server=ctx.server, bin_dir=ctx.bin_dir, state_dir=state_dir
        )
        _wait_for_default_service_account(ctx, tokens["admin"])
        _check_with_kubectl(cluster)
        _write_json(state_dir / "cluster.json", {"server": ctx.server, "bin_dir": str(ctx.bin_dir), "ports": ctx.ports})
    except BaseException:  # Ctrl-C included: never leave half a cluster running
        down(state_dir)
        raise
    _say(f"cluster up in {time.monotonic() - started:.1f}s: {ctx.server}")
    return cluster


def _wait_for_default_service_account(ctx: Context, admin_token: str, timeout: float = 60) -> None:
    # Pods are refused in a namespace until the controller-manager created its
    # `default` ServiceAccount, so a cluster without one is not usable yet.
    url = f"{ctx.server}/api/v1/namespaces/default/serviceaccounts/default"
    deadline = time.monotonic() + timeout
    while _get(url, ctx.pki("ca.crt"), admin_token) is None:
        if time.monotonic() > deadline:
            log = ctx.state_dir / "logs" / "kube-controller-manager.log"
            raise ClusterError(f"no ServiceAccount default/default after {timeout:.0f}s\n{_tail(log)}")
        time.sleep(0.2)


def _check_with_kubectl(cluster: Cluster) -> None:
    """The admin kubeconfig works for the real client, not just for our probes."""
    kubectl = [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig), "get", "--raw", "/readyz"]
    result = subprocess.run(kubectl, check=False, env=cluster.env(), capture_output=True, text=True, timeout=30)
    if result.returncode != 0 or result.stdout.strip() != "ok":
        raise ClusterError(f"`kubectl get --raw /readyz` said {result.stdout!r} {result.stderr!r}")


def down(state_dir: Path = DEFAULT_STATE_DIR) -> None:
    """Stop every process `up` started in `state_dir` and delete its state, except logs/."""
    state_dir = Path(state_dir).resolve()
    run = state_dir / "run"
    pidfiles = list(run.glob("*.pid")) if run.is_dir() else []
    # Reverse start order: the API server outlives its clients, etcd outlives it.
    pidfiles.sort(key=lambda p: (_read_json(p) or {}).get("started", 0), reverse=True)
    for pidfile in pidfiles:
        _stop(pidfile)
    if (state_dir / "node").exists():  # node agent hook: its netns, links and processes, even if it was killed
        from . import node

        node.cleanup(state_dir)
    for name in MANAGED:
        path = state_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


# --- Waiting on objects ---------------------------------------------------------


def condition_is_true(obj: Mapping[str, Any], condition: str) -> bool:
    """Whether `obj` has `condition` with status True, observed at its current generation when
    the condition (or the status) says which generation it observed, as `kubectl wait` checks."""
    status = obj.get("status") or {}
    found = next((c for c in status.get("conditions") or [] if c.get("type") == condition), None)
    if found is None or found.get("status") != "True":
        return False
    observed = found.get("observedGeneration", status.get("observedGeneration"))
    generation = (obj.get("metadata") or {}).get("generation")
    return observed is None or generation is None or observed >= generation


def wait_condition(
    cluster: Cluster, resource: str, condition: str, timeout: float = 60, namespace: str | None = None
) -> dict[str, Any]:
    """Polls `kubectl get <resource>` until its `condition` is True, and returns the object; after
    `timeout` seconds raises ClusterError with the last status (or kubectl error) it saw.

    Not `kubectl wait --for=condition=...`: kubectl gives up at once, instead of polling, on an
    object whose `status.conditions` is null, and a CustomResourceDefinition is such an object
    until the API server first writes its status (the Go field has no omitempty). The same goes
    for `--for=jsonpath=` with a `[?(@.type==...)]` filter."""
    argv = [str(cluster.bin_dir / "kubectl"), "get", resource, "-o", "json"]
    if namespace is not None:
        argv += ["-n", namespace]
    deadline = time.monotonic() + timeout
    while True:
        result = subprocess.run(argv, env=cluster.env(), capture_output=True, text=True, timeout=30, check=False)
        if result.returncode == 0:
            obj: dict[str, Any] = json.loads(result.stdout)
            if condition_is_true(obj, condition):
                return obj
            seen = f"status {json.dumps(obj.get('status'))}"
        else:
            seen = result.stderr.strip()
        if time.monotonic() > deadline:
            raise ClusterError(f"{resource} was not {condition} after {timeout:.0f}s; last seen: {seen}")
        time.sleep(0.2)


def install_crds(cluster: Cluster, source: Path = REPO / "crds", timeout: float = 60) -> None:
    """Applies the CRDs in `source` (a file or directory; by default crds/, the source of truth)
    server-side, taking over fields another manager such as a Helm install set, and waits until
    the API server serves each of them (Established)."""
    kubectl = [str(cluster.bin_dir / "kubectl"), "apply", "--server-side", "--force-conflicts", "-o", "name"]
    result = subprocess.run(
        [*kubectl, "-f", str(source)], env=cluster.env(), capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise ClusterError(f"`kubectl apply -f {source}` failed: {result.stderr.strip()}")
    for name in result.stdout.split():
        wait_condition(cluster, name, "Established", timeout)


# --- Command line ---------------------------------------------------------------


def _usage(cluster: Cluster, state_dir: Path, node: bool = False, kwok_nodes: int = 0) -> str:
    script = f"{shlex.quote(sys.executable)} -m devcluster"
    stop = "make dev-cluster-down" if state_dir == DEFAULT_STATE_DIR else f"{script} down --state-dir {state_dir}"
    nodes = (
        f"node {NODE_NAME} runs pods as local processes; their logs: {state_dir / 'logs' / 'pods'}"
        if node
        else "no nodes: Pods stay Pending"
    )
    if kwok_nodes:
        toleration = json.dumps(KWOK_TOLERATION).replace('"', "")
        kwok = f"{kwok_nodes} kwok node(s), where pods that tolerate {toleration} turn Ready without running"
        nodes = f"{nodes}; {kwok}" if node else f"no kubelet: Pods stay Pending; {kwok}"
    return f"""
Kubernetes control plane running at {cluster.server} ({nodes}).

  export KUBECONFIG={shlex.quote(str(cluster.kubeconfig))}
  export PATH={shlex.quote(str(cluster.bin_dir))}:"$PATH"    # pinned kubectl and helm
  kubectl get ns

  (or: eval "$({script} env --state-dir {state_dir})")
Logs: {state_dir / "logs"}/<component>.log
Stop it and delete its state: {stop}
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down", "env"))
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="default: %(default)s")
    parser.add_argument("--node", action="store_true", help="up: with a node that runs pods (devcluster.node)")
    parser.add_argument(
        "--kwok-nodes",
        type=int,
        default=0,
        metavar="N",
        help="up: with N fake nodes run by kwok, where pods that tolerate their taint turn Ready (default: none)",
    )
    args = parser.parse_args(argv)
    args.state_dir = args.state_dir.resolve()
    if args.kwok_nodes < 0:
        parser.error(f"--kwok-nodes must be 0 or more, not {args.kwok_nodes}")
    if args.command == "up":
        components = COMPONENTS_WITH_NODE if args.node else COMPONENTS
        try:
            cluster = up(args.state_dir, with_kwok(args.kwok_nodes, components) if args.kwok_nodes else components)
        except ClusterError as e:
            _say(f"failed: {e}")
            return 1
        print(_usage(cluster, args.state_dir, args.node, args.kwok_nodes))
    elif args.command == "down":
        down(args.state_dir)
        _say(f"no cluster running in {args.state_dir}; logs (if any) kept in logs/")
    else:
        found = running(args.state_dir)
        if found is None:
            _say(f"no healthy cluster in {args.state_dir}; start one with `make dev-cluster`")
            return 1
        print(f"export KUBECONFIG={shlex.quote(str(found.kubeconfig))}")
        print(f'export PATH={shlex.quote(str(found.bin_dir))}:"$PATH"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
