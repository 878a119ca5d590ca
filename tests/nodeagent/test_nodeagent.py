"""The dev node runs pods as a kubelet would, as far as the project's tests rely on it:
status and probes, env and args, names that resolve, restarts, graceful deletion,
volumes and claims, and nothing left behind after `down`."""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

import devcluster
from devcluster import node as nodeagent
from fixtures.support import ROOT, Kubectl, wait_for

# An HTTP server on 8080 that prints its arguments and, on SIGTERM, writes $MARKER and exits.
SERVER = """
import http.server, os, signal, sys
print('argv:', ' '.join(sys.argv[1:]), flush=True)
def term(*_):
    if os.environ.get('MARKER'):
        open(os.environ['MARKER'], 'w').write('SIGTERM')
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
http.server.ThreadingHTTPServer(('', 8080), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


def server_container(*args: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "main",
        "image": "never-pulled.invalid/server:1",
        "command": ["python", "-c", SERVER],
        "args": list(args),
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        **extra,
    }


def pod(name: str, namespace: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {"automountServiceAccountToken": False, "containers": [container], **spec},
    }


def get_pod(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = kubectl.json("get", "pod", name, "-n", namespace)
    return result


def brief(pod: dict[str, Any]) -> dict[str, Any]:
    status = pod.get("status", {})
    return {
        "uid": pod["metadata"]["uid"][:8],
        "phase": status.get("phase"),
        "podIP": status.get("podIP"),
        "conditions": {c["type"]: c["status"] for c in status.get("conditions", [])},
        "containers": [
            {k: c.get(k) for k in ("ready", "restartCount", "state", "lastState")}
            for c in status.get("containerStatuses", [])
        ],
    }


def log_of(state_dir: Path, namespace: str, name: str, container: str = "main") -> str:
    path = state_dir / "logs" / "pods" / f"{namespace}_{name}" / f"{container}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def wait_pod(
    kubectl: Kubectl, namespace: str, name: str, done: Any, what: str, state_dir: Path, timeout: float = 60
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        p = get_pod(kubectl, namespace, name)
        return p if done(p) else None

    def show() -> str:
        try:
            seen = brief(get_pod(kubectl, namespace, name))
        except AssertionError as e:
            seen = {"error": str(e)[-300:]}
        return f"{seen}\n--- container log ---\n{log_of(state_dir, namespace, name)[-2000:]}"

    return wait_for(probe, timeout, f"pod {name}: {what}", show=show)


def is_ready(p: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))


def restarts(p: dict[str, Any]) -> int:
    return sum(c.get("restartCount", 0) for c in p.get("status", {}).get("containerStatuses", []))


def test_pod_runs_ready_with_its_ip_env_and_args(kubectl: Kubectl, namespace: str, state_dir: Path) -> None:
    env = [
        {"name": n, "valueFrom": {"fieldRef": {"fieldPath": f}}}
        for n, f in [
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
            ("POD_IP", "status.podIP"),
            ("NODE_NAME", "spec.nodeName"),
        ]
    ] + [{"name": "GREETING", "value": "hello-$(POD_NAME)"}, {"name": "CM_B", "value": "env-wins"}]
    # envFrom as a kubelet reads it: in order, with a prefix, a missing optional source skipped,
    # and `env` winning over it.
    kubectl.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": namespace},
                   "data": {"A": "from-configmap", "B": "overridden"}})  # fmt: skip
    kubectl.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "secret", "namespace": namespace},
                   "stringData": {"S": "from-secret"}})  # fmt: skip
    env_from = [
        {"configMapRef": {"name": "settings"}, "prefix": "CM_"},
        {"secretRef": {"name": "secret"}},
        {"configMapRef": {"name": "absent", "optional": True}},
    ]
    args = ["$(POD_NAME)", "$(POD_NAMESPACE)", "$(POD_IP)", "$(NODE_NAME)", "$(GREETING)", "$(UNSET)", "$$(POD_NAME)",
            "$(CM_A)", "$(CM_B)", "$(S)"]  # fmt: skip
    kubectl.apply(pod("plain", namespace, server_container(*args, env=env, envFrom=env_from)))

    p = wait_pod(kubectl, namespace, "plain", is_ready, "Ready", state_dir)

    ip = p["status"]["podIP"]
    subnet = nodeagent.Network(nodeagent.Layout(state_dir)).subnet
    assert subnet is not None and ipaddress.ip_address(ip) in subnet, (ip, subnet)
    assert p["status"]["phase"] == "Running"
    assert p["spec"]["nodeName"] == devcluster.NODE_NAME
    [status] = p["status"]["containerStatuses"]
    assert status["ready"] and status["started"] and "running" in status["state"], status
    expected = (
        f"argv: plain {namespace} {ip} {devcluster.NODE_NAME} hello-plain $(UNSET) $(POD_NAME) "
        "from-configmap env-wins from-secret"
    )
    assert expected in log_of(state_dir, namespace, "plain"), log_of(state_dir, namespace, "plain")


def test_a_pod_waits_for_the_configmap_its_envfrom_names(kubectl: Kubectl, namespace: str, state_dir: Path) -> None:
    container = server_container("$(LATER)", envFrom=[{"configMapRef": {"name": "later"}}])
    kubectl.apply(pod("waits", namespace, container))

    def waiting(p: dict[str, Any]) -> bool:
        conditions = {c["type"]: c for c in p.get("status", {}).get("conditions", [])}
        return "configmap later" in conditions.get("Initialized", {}).get("message", "")

    p = wait_pod(kubectl, namespace, "waits", waiting, "Pending, naming the missing ConfigMap", state_dir)
    assert p["status"]["phase"] == "Pending", brief(p)
    kubectl.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "later", "namespace": namespace},
                   "data": {"LATER": "arrived"}})  # fmt: skip
    wait_pod(kubectl, namespace, "waits", is_ready, "Ready once the ConfigMap exists", state_dir)
    assert "argv: arrived" in log_of(state_dir, namespace, "waits")


def test_pods_and_clients_reach_pods_by_pod_hostname_and_service_name(
    kubectl: Kubectl, namespace: str, state_dir: Path
) -> None:
    # A StatefulSet's pod as the StatefulSet controller makes it: hostname and subdomain
    # naming a headless Service; and a ClusterIP Service in front of it.
    kubectl.apply(pod("web-0", namespace, server_container(), hostname="web-0", subdomain="web"))
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {"clusterIP": "None", "selector": {"app": "web-0"}, "ports": [{"port": 8080}]},
        }
    )
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "front", "namespace": namespace},
            "spec": {"selector": {"app": "web-0"}, "ports": [{"port": 8080}]},
        }
    )
    wait_pod(kubectl, namespace, "web-0", is_ready, "Ready", state_dir)
    names = [
        f"web-0.web.{namespace}.svc.cluster.local",
        "front",
        f"front.{namespace}",
        f"front.{namespace}.svc.cluster.local",
    ]
    fetch = (
        "import sys, urllib.request\n"
        "for n in sys.argv[1:]: print(n, urllib.request.urlopen(f'http://{n}:8080/', timeout=5).status, flush=True)"
    )

    kubectl.apply(
        pod(
            "caller",
            namespace,
            {"name": "main", "image": "x", "command": ["python", "-c", fetch], "args": names},
            restartPolicy="Never",
        )
    )
    wait_pod(
        kubectl, namespace, "caller", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), "done", state_dir
    )
    assert get_pod(kubectl, namespace, "caller")["status"]["phase"] == "Succeeded", log_of(
        state_dir, namespace, "caller"
    )
    for name in names:
        assert f"{name} 200" in log_of(state_dir, namespace, "caller")

    with nodeagent.client_netns(state_dir, namespace) as prefix:
        result = subprocess.run(
            [*prefix, "python", "-c", fetch, *names],
            env=nodeagent.client_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 0, result.stderr
    assert all(f"{name} 200" in result.stdout for name in names), result.stdout


def test_a_container_that_exits_is_restarted(kubectl: Kubectl, namespace: str, state_dir: Path) -> None:
    container = {
        "name": "main",
        "image": "x",
        "command": ["python", "-c", "print('run', flush=True); raise SystemExit(3)"],
    }
    kubectl.apply(pod("exits", namespace, container))

    p = wait_pod(kubectl, namespace, "exits", lambda p: restarts(p) >= 2, "2 restarts", state_dir)

    [status] = p["status"]["containerStatuses"]
    assert status["lastState"]["terminated"]["exitCode"] == 3, status
    assert log_of(state_dir, namespace, "exits").count("run\n") >= 2


def test_a_failing_liveness_probe_restarts_the_container(kubectl: Kubectl, namespace: str, state_dir: Path) -> None:
    liveness = {"httpGet": {"path": "/no-such-page", "port": 8080}, "periodSeconds": 1, "failureThreshold": 2}
    kubectl.apply(
        pod("unhealthy", namespace, server_container(livenessProbe=liveness), terminationGracePeriodSeconds=5)
    )

    p = wait_pod(kubectl, namespace, "unhealthy", lambda p: restarts(p) >= 1, "a restart", state_dir)

    [status] = p["status"]["containerStatuses"]
    assert "Liveness probe failed" in status["lastState"]["terminated"].get("message", ""), status
    # The server handled the SIGTERM it got for the failed probe: a clean exit, not a SIGKILL.
    assert status["lastState"]["terminated"]["exitCode"] == 0, status


# Burns one core for 4 s of wall time, then prints the share of a core it got.
BURN = """
import os, time
start, cpu = time.monotonic(), sum(os.times()[:2])
while time.monotonic() - start < 4:
    pass
print('cores used:', round((sum(os.times()[:2]) - cpu) / (time.monotonic() - start), 3), flush=True)
"""


@pytest.mark.parametrize(
    ("resources", "files"),
    [
        ({}, {}),
        ({"requests": {"cpu": "250m"}}, {"cpu.shares": 256}),
        ({"limits": {"cpu": "500m"}}, {"cpu.cfs_period_us": 100_000, "cpu.cfs_quota_us": 50_000, "cpu.shares": 512}),
        (
            {"requests": {"cpu": "0.1"}, "limits": {"cpu": "1.5"}},
            {"cpu.cfs_period_us": 100_000, "cpu.cfs_quota_us": 150_000, "cpu.shares": 102},
        ),
        # The kernel's floors: a 1 ms quota, 2 shares.
        ({"limits": {"cpu": "1m"}}, {"cpu.cfs_period_us": 100_000, "cpu.cfs_quota_us": 1_000, "cpu.shares": 2}),
        ({"limits": {"memory": "1Gi"}}, {}),
    ],
)
def test_cpu_resources_become_the_cgroup_files_a_kubelet_writes(
    resources: dict[str, Any], files: dict[str, int]
) -> None:
    assert nodeagent.cfs_settings(resources) == files


@pytest.mark.parametrize(
    ("quantity", "expected"), [("500m", 500), ("2", 2000), ("0.25", 250), (1, 1000), ("1.0005", 1001), (None, None)]
)
def test_cpu_quantities_in_millicores_round_up(quantity: str | int | None, expected: int | None) -> None:
    assert nodeagent.millicores(quantity) == expected


def test_a_cpu_limit_is_enforced_and_its_cgroup_goes_with_the_pod(
    kubectl: Kubectl, namespace: str, state_dir: Path
) -> None:
    # The same loop twice at once, under the same load of the machine: with a 200m limit, and
    # without one (the control: what this machine gives the loop right now).
    def burner(limits: dict[str, str]) -> dict[str, Any]:
        return {"name": "main", "image": "x", "command": ["python", "-c", BURN], "resources": {"limits": limits}}

    kubectl.apply(pod("limited", namespace, burner({"cpu": "200m"}), restartPolicy="Never"))
    kubectl.apply(pod("unlimited", namespace, burner({}), restartPolicy="Never"))
    uid = wait_pod(
        kubectl, namespace, "limited", lambda p: p["status"].get("phase") == "Running", "Running", state_dir
    )["metadata"]["uid"]
    cgroup = nodeagent.Layout(state_dir).cpu_cgroup / f"pod{uid}" / "main"
    assert (cgroup / "cpu.cfs_quota_us").read_text().strip() == "20000", cgroup
    # The node reports a container running only once its process is in the cgroup.
    assert (cgroup / "cgroup.procs").read_text().split(), f"no process in {cgroup}"
    used = {}
    for name in ("limited", "unlimited"):
        wait_pod(kubectl, namespace, name, lambda p: p["status"].get("phase") == "Succeeded", "Succeeded", state_dir)
        [used[name]] = [
            float(line.split()[-1])
            for line in log_of(state_dir, namespace, name).splitlines()
            if line.startswith("cores used:")
        ]
    stat = dict(line.split() for line in (cgroup / "cpu.stat").read_text().splitlines())
    print(f"\ncores used by the same loop with a 200m limit and without: {used}; its cgroup's cpu.stat: {stat}")
    # Held to 200m, about 0.2 of a core: the kernel stopped the loop for the rest of a period when it
    # had used its 20 ms (throttled), whatever else the machine ran.
    assert used["limited"] < 0.3, f"the loop used {used['limited']} cores under a 200m limit"
    assert int(stat["nr_throttled"]) > 0 and int(stat["throttled_time"]) > 0, f"never throttled: {stat}; {used}"
    # The same loop unlimited gets most of a core on a machine with one to spare: then the limit shows
    # in what each got. Beside make test's other lanes it may get less than the limit (0.155 of a
    # core on 2026-11-30), and the comparison would say nothing; the throttling above still does.
    if used["unlimited"] >= 0.5:
        assert used["limited"] / used["unlimited"] < 0.6, f"cores used: {used}: the limit made no difference"

    kubectl.run("delete", "pod", "limited", "unlimited", "-n", namespace)
    wait_for(lambda: not cgroup.parent.exists(), 30, f"{cgroup.parent} to be removed with the pod")


def test_deleting_a_pod_sends_sigterm_then_removes_it(kubectl: Kubectl, namespace: str, state_dir: Path) -> None:
    markers = state_dir / "test-markers" / secrets.token_hex(4)
    markers.mkdir(parents=True)
    container = server_container(
        env=[{"name": "MARKER", "value": "/tmp/marker/terminated"}],
        volumeMounts=[{"name": "tmp", "mountPath": "/tmp"}, {"name": "marker", "mountPath": "/tmp/marker"}],
    )
    volumes = [{"name": "tmp", "emptyDir": {}}, {"name": "marker", "hostPath": {"path": str(markers)}}]
    kubectl.apply(pod("stopped", namespace, container, volumes=volumes))
    wait_pod(kubectl, namespace, "stopped", is_ready, "Ready", state_dir)

    kubectl.run("delete", "pod", "stopped", "-n", namespace, "--wait=false")

    wait_for(
        lambda: "NotFound" in kubectl.run("get", "pod", "stopped", "-n", namespace, check=False).stderr,
        40,
        "pod stopped to be gone",
        show=lambda: kubectl.run("get", "pod", "stopped", "-n", namespace, "-o", "yaml", check=False).stdout,
    )
    assert (markers / "terminated").read_text() == "SIGTERM"


def test_a_statefulset_pod_keeps_its_claim_and_ip_when_recreated(
    kubectl: Kubectl, namespace: str, state_dir: Path
) -> None:
    script = 'echo "$(POD_NAME) $(POD_IP)" >> /var/lib/tfdata/starts && exec python -c "$0"'
    container = server_container(
        command=["sh", "-c", script, SERVER],
        env=[
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        volumeMounts=[{"name": "data", "mountPath": "/var/lib/tfdata"}],
    )
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "store", "namespace": namespace},
            "spec": {"clusterIP": "None", "selector": {"app": "store"}, "ports": [{"port": 8080}]},
        }
    )
    kubectl.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "store", "namespace": namespace},
            "spec": {
                "replicas": 1,
                "serviceName": "store",
                "selector": {"matchLabels": {"app": "store"}},
                "template": {
                    "metadata": {"labels": {"app": "store"}},
                    "spec": {
                        "automountServiceAccountToken": False,
                        "terminationGracePeriodSeconds": 5,
                        "containers": [container],
                    },
                },
                "volumeClaimTemplates": [
                    {
                        "metadata": {"name": "data"},
                        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
                    }
                ],
            },
        }
    )
    wait_for(
        lambda: kubectl.run("get", "pod", "store-0", "-n", namespace, check=False).returncode == 0, 30, "pod store-0"
    )
    first = wait_pod(kubectl, namespace, "store-0", is_ready, "Ready", state_dir)
    claim = kubectl.json("get", "pvc", "data-store-0", "-n", namespace)
    assert claim["status"]["phase"] == "Bound"
    assert claim["spec"]["storageClassName"] == nodeagent.STORAGE_CLASS
    volume = kubectl.json("get", "pv", claim["spec"]["volumeName"])
    starts = Path(volume["spec"]["hostPath"]["path"]) / "starts"
    ip = first["status"]["podIP"]
    assert starts.read_text() == f"store-0 {ip}\n"

    kubectl.run("delete", "pod", "store-0", "-n", namespace, "--wait=false")

    second = wait_pod(
        kubectl,
        namespace,
        "store-0",
        lambda p: p["metadata"]["uid"] != first["metadata"]["uid"] and is_ready(p),
        "recreated and Ready",
        state_dir,
    )
    assert second["status"]["podIP"] == ip
    assert starts.read_text() == f"store-0 {ip}\nstore-0 {ip}\n"


def test_empty_dir_and_config_map_volumes_are_mounted(kubectl: Kubectl, namespace: str, state_dir: Path) -> None:
    token = secrets.token_hex(4)
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": namespace},
            "data": {"greeting": "hello from a configMap"},
        }
    )
    script = f"cat /tmp/config/greeting; echo; touch /tmp/made-{token}; ls /tmp; sleep 3600"
    container = {
        "name": "main",
        "image": "x",
        "command": ["sh", "-c", script],
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "config", "mountPath": "/tmp/config", "readOnly": True},
        ],
    }
    volumes = [{"name": "tmp", "emptyDir": {}}, {"name": "config", "configMap": {"name": "settings"}}]
    kubectl.apply(pod("volumes", namespace, container, volumes=volumes))

    wait_for(
        lambda: f"made-{token}" in log_of(state_dir, namespace, "volumes"),
        30,
        "the pod's listing of /tmp",
        show=lambda: log_of(state_dir, namespace, "volumes"),
    )
    assert "hello from a configMap" in log_of(state_dir, namespace, "volumes")
    # The pod's /tmp is its emptyDir, not the host's.
    assert not Path(f"/tmp/made-{token}").exists()
    assert (state_dir / "node" / "pods" / f"{namespace}_volumes" / "volumes" / "tmp" / f"made-{token}").exists()


@pytest.fixture
def own_cluster() -> Any:
    state_dir = ROOT / ".local" / f"nodeagent-down-{os.getpid()}"
    try:
        yield devcluster.up(state_dir, devcluster.COMPONENTS_WITH_NODE)
    finally:
        devcluster.down(state_dir)
    shutil.rmtree(state_dir)  # only after a pass: the logs explain a failure


def test_down_leaves_nothing_behind_even_after_the_agent_was_killed(own_cluster: devcluster.Cluster) -> None:
    assert own_cluster.state_dir is not None
    kubectl = Kubectl(own_cluster.bin_dir / "kubectl", own_cluster.env())
    wait_for(lambda: kubectl.run("get", "sa", "default", check=False).returncode == 0, 30, "ServiceAccount default")
    token = f"leftover-{secrets.token_hex(4)}"
    # With a CPU limit: its cgroup, too, must go.
    kubectl.apply(pod("lingers", "default", server_container(token, resources={"limits": {"cpu": "500m"}})))
    wait_pod(kubectl, "default", "lingers", is_ready, "Ready", own_cluster.state_dir)
    with nodeagent.client_netns(own_cluster.state_dir):  # a client namespace that is never closed...
        pidfile = json.loads((own_cluster.state_dir / "run" / "node-agent.pid").read_text())
        os.kill(pidfile["pid"], signal.SIGKILL)  # ...and an agent that cannot clean up
        assert any(nodeagent.leftovers(own_cluster.state_dir, token).values())

        devcluster.down(own_cluster.state_dir)

        left = nodeagent.leftovers(own_cluster.state_dir, token)
        assert not any(left.values()), left
