"""The agent: registers the Node and keeps it Ready, starts and stops a PodRunner per pod
bound to it, keeps the hosts files current, and provisions the `standard` StorageClass's
claims as directories."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from .api import Api, ApiError, Obj, timestamp
from .cpu import CpuLimits
from .hosts import hosts_entries, hosts_text, write_hosts
from .network import Layout, Network, cleanup
from .pods import PodRunner

NODE_NAME = "tfdata-dev-node"
STORAGE_CLASS = "standard"
PROVISIONER = "tfdata.dev/dev-node"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
HEARTBEAT_SECONDS = 10.0
SHUTDOWN_GRACE_SECONDS = 3.0  # devcluster's `down` SIGKILLs the agent after 10 s

log = logging.getLogger("nodeagent")


class Agent:
    def __init__(self, state_dir: Path, kubeconfig: Path, node_name: str, venv_bin: Path) -> None:
        self.layout = Layout(state_dir)
        self.api = Api(kubeconfig)
        self.node_name = node_name
        self.venv_bin = venv_bin
        self.network = Network(self.layout)
        self.cpu = CpuLimits(self.layout)
        self.runners: dict[str, PodRunner] = {}
        self.stopping = threading.Event()
        self.wake = threading.Event()
        self.entries: tuple[dict[str, list[str]], dict[str, dict[str, list[str]]]] = ({}, {})
        self.service_ips: dict[tuple[str, str], list[str]] = {}  # hosts_entries' memory
        self.ready_since = timestamp()

    def hosts_for(self, namespace: str | None) -> str:
        return hosts_text(self.entries, namespace)

    # Start and stop.

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping.set()
        self.wake.set()

    def run(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        # A previous agent of this state dir may have died without cleaning up: its pods'
        # processes and namespaces go, and the pods bound here start again (same IPs).
        cleanup(self.layout.state_dir)
        self.network.setup()
        self.cpu.setup()
        self._register()
        # Pods of this node (start them at once) and claims (provision them before the scheduler looks).
        for path, selector in (("pods", f"spec.nodeName={self.node_name}"), ("persistentvolumeclaims", "")):
            threading.Thread(target=self._watch, args=(path, selector), name=f"watch {path}", daemon=True).start()
        log.info("node %s ready: pods on %s, state in %s", self.node_name, self.network.subnet, self.layout.node_dir)
        next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
        while not self.stopping.is_set():
            self.wake.wait(1.0)
            self.wake.clear()
            try:
                self._sync()
                if time.monotonic() >= next_heartbeat:
                    self._heartbeat()
                    next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
            except Exception as e:  # the API server restarting, a watch broken: level-based, so retry
                log.warning("sync failed: %s", e)
                self.stopping.wait(1.0)
        self._shutdown()

    def _shutdown(self) -> None:
        log.info("stopping: %d pods", len(self.runners))
        for runner in self.runners.values():
            runner.request_stop(min(SHUTDOWN_GRACE_SECONDS, self._grace(runner.pod)), delete=False)
        for runner in self.runners.values():
            runner.join(SHUTDOWN_GRACE_SECONDS + 2)
        cleanup(self.layout.state_dir)
        log.info("stopped")

    # The Node.

    def _node_status(self) -> Obj:
        now = timestamp()
        ok = [("MemoryPressure", "KubeletHasSufficientMemory"), ("DiskPressure", "KubeletHasNoDiskPressure"),
              ("PIDPressure", "KubeletHasSufficientPID")]  # fmt: skip
        conditions = [
            {"type": t, "status": "False", "reason": r, "message": "dev node", "lastHeartbeatTime": now,
             "lastTransitionTime": self.ready_since} for t, r in ok
        ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "tfdata dev node is running pods",
              "lastHeartbeatTime": now, "lastTransitionTime": self.ready_since}]  # fmt: skip
        # Disk enough that CPU and memory bound how many servers fit, as before each server requested
        # its /tmp (spec.<component>.tmpSizeLimit) as ephemeral-storage.
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "1Ti"}
        return {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": self.network.gateway},
                {"type": "Hostname", "address": self.node_name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": self.layout.id,
                "systemUUID": self.layout.id,
                "bootID": self.ready_since,
                "kernelVersion": os.uname().release,
                "osImage": "tfdata dev node",
                "containerRuntimeVersion": "devnode://0",
                "kubeletVersion": "v0.0.0-devnode",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def _register(self) -> None:
        labels = {"kubernetes.io/hostname": self.node_name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
        self.api.create(
            "/api/v1/nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node_name, "labels": labels}},
        )
        self._heartbeat()
        self.api.create(
            "/apis/storage.k8s.io/v1/storageclasses",
            {
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": STORAGE_CLASS, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
                "provisioner": PROVISIONER, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
            },
        )  # fmt: skip

    def _heartbeat(self) -> None:
        """Node status and Lease: without them the node lifecycle controller marks the node
        NotReady after ~40 s and taints it."""
        self.api.merge_patch(f"/api/v1/nodes/{self.node_name}/status", {"status": self._node_status()})
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node_name}"
        renew = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {"holderIdentity": self.node_name, "leaseDurationSeconds": 40, "renewTime": renew}
        if self.api.get(path) is None:
            self.api.create(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.node_name},
                    "spec": spec,
                },
            )
        else:
            self.api.merge_patch(path, {"spec": spec})

    # The loop.

    def _watch(self, resource: str, field_selector: str) -> None:
        """Wakes the loop as soon as something changes; the loop itself re-lists every second,
        so a broken watch only costs latency until it is re-established."""
        query = [("watch", "true"), ("fieldSelector", field_selector), ("timeoutSeconds", "300")]
        while not self.stopping.is_set():
            try:
                for _ in self.api.call("GET", f"/api/v1/{resource}", query=query, timeout=330, stream=True):
                    self.wake.set()
            except Exception as e:
                log.info("watch of %s ended (%s); watching again", resource, e)
                self.stopping.wait(1.0)

    def _sync(self) -> None:
        pods = self.api.call("GET", "/api/v1/pods")["items"]
        services = self.api.call("GET", "/api/v1/services")["items"]
        self._sync_pods([p for p in pods if p["spec"].get("nodeName") == self.node_name])
        self.entries = hosts_entries(pods, services, self.service_ips)
        self._write_all_hosts()
        claims = self.api.call("GET", "/api/v1/persistentvolumeclaims")["items"]
        self._provision(claims)
        self._unstick(pods, claims)

    def _unstick(self, pods: list[Obj], claims: list[Obj]) -> None:
        """Binds to this node a pod the scheduler gave up on while its claims were being bound.

        kube-scheduler (1.34) sometimes misses the claim's update when it came while the pod
        was being scheduled, and then waits 5 minutes before it tries again (seen once in a
        few runs of a StatefulSet with a claim). No test should wait that out.
        """
        bound = {
            (c["metadata"]["namespace"], c["metadata"]["name"])
            for c in claims
            if c.get("status", {}).get("phase") == "Bound"
        }
        for pod in pods:
            meta, spec = pod["metadata"], pod["spec"]
            claimed = [
                v["persistentVolumeClaim"]["claimName"] for v in spec.get("volumes", []) if "persistentVolumeClaim" in v
            ]
            scheduled = [c for c in pod.get("status", {}).get("conditions", []) if c["type"] == "PodScheduled"]
            if spec.get("nodeName") or not claimed or meta.get("deletionTimestamp") or not scheduled:
                continue
            if scheduled[0]["status"] != "False" or scheduled[0].get("reason") != "Unschedulable":
                continue
            since = datetime.strptime(scheduled[0]["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ").replace(
                tzinfo=timezone.utc
            )
            if (datetime.now(timezone.utc) - since).total_seconds() < 5:
                continue
            if all((meta["namespace"], c) in bound for c in claimed):
                with contextlib.suppress(ApiError):
                    self.api.call(
                        "POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
                        {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"], "uid": meta["uid"]},
                         "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name}},
                    )  # fmt: skip
                    log.warning(
                        "%s/%s: unschedulable although its claims are bound now; bound it here",
                        meta["namespace"],
                        meta["name"],
                    )

    @staticmethod
    def _grace(pod: Obj) -> float:
        meta = pod["metadata"]
        value = meta.get("deletionGracePeriodSeconds", pod["spec"].get("terminationGracePeriodSeconds", 30))
        return float(value if value is not None else 30)

    def _sync_pods(self, pods: list[Obj]) -> None:
        seen = {}
        for pod in pods:
            meta = pod["metadata"]
            key = f"{meta['namespace']}/{meta['name']}"
            seen[key] = meta["uid"]
            runner = self.runners.get(key)
            if runner is not None and runner.uid != meta["uid"]:
                runner.request_stop(0, delete=False)  # an older pod of that name, force-deleted
                continue  # the new one starts once the old one is torn down
            if runner is None:
                if meta.get("deletionTimestamp") or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    if meta.get("deletionTimestamp"):  # nothing runs for it here: finish the deletion
                        with contextlib.suppress(ApiError):
                            self.api.call("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                                          {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})  # fmt: skip
                    continue
                runner = self.runners[key] = PodRunner(self, pod)
                log.info("%s: bound here; starting", key)
                runner.start()
            runner.pod = pod
            if meta.get("deletionTimestamp"):
                runner.request_stop(self._grace(pod), delete=True)
        for key, runner in list(self.runners.items()):
            if seen.get(key) != runner.uid:
                runner.request_stop(2, delete=False)  # gone from the API without us (force-deleted)
            if not runner.is_alive():  # done, or failed to set up (logged): the next sync starts it again
                del self.runners[key]

    def _write_all_hosts(self) -> None:
        targets = {r.netns: r.pod["metadata"]["namespace"] for r in self.runners.values() if r.netns}
        if self.layout.clients_dir.is_dir():
            for reg in self.layout.clients_dir.iterdir():
                with contextlib.suppress(OSError, ValueError):
                    targets[reg.name] = json.loads(reg.read_text()).get("namespace")
        for netns, namespace in targets.items():
            text = self.hosts_for(namespace)
            # Compare with the file itself, not with what was last written: a namespace name
            # comes back when its IP is reused (a new client, a recreated pod) with a fresh file.
            with contextlib.suppress(OSError):
                if Path(f"/etc/netns/{netns}/hosts").read_text() != text and Path(f"/run/netns/{netns}").exists():
                    write_hosts(netns, text)

    def _provision(self, claims: list[Obj]) -> None:
        """Claims of the `standard` class get a directory and a PV pre-bound to them; PVs of
        deleted claims (Released) go, with their directory."""
        for pvc in claims:
            meta, spec = pvc["metadata"], pvc["spec"]
            if (
                pvc.get("status", {}).get("phase") != "Pending"
                or spec.get("volumeName")
                or spec.get("storageClassName") != STORAGE_CLASS
            ):
                continue
            name = f"pvc-{meta['uid']}"
            directory = self.layout.volumes_dir / name
            directory.mkdir(parents=True, exist_ok=True)
            pv = {
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
                "spec": {
                    "capacity": {"storage": spec.get("resources", {}).get("requests", {}).get("storage", "1Gi")},
                    "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                    "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
                    "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                                 "name": meta["name"], "uid": meta["uid"]},
                    "storageClassName": STORAGE_CLASS, "persistentVolumeReclaimPolicy": "Delete",
                    "volumeMode": spec.get("volumeMode", "Filesystem"),
                },
            }  # fmt: skip
            self.api.create("/api/v1/persistentvolumes", pv)
            log.info("provisioned %s for claim %s/%s at %s", name, meta["namespace"], meta["name"], directory)
        for pv in self.api.call("GET", "/api/v1/persistentvolumes")["items"]:
            meta = pv["metadata"]
            ours = meta.get("annotations", {}).get("pv.kubernetes.io/provisioned-by") == PROVISIONER
            if not ours or pv.get("status", {}).get("phase") != "Released" or meta.get("deletionTimestamp"):
                continue
            if pv["spec"].get("persistentVolumeReclaimPolicy") != "Delete":
                continue
            with contextlib.suppress(ApiError):
                self.api.call("DELETE", f"/api/v1/persistentvolumes/{meta['name']}")
            path = pv["spec"].get("hostPath", {}).get("path", "")
            if path.startswith(str(self.layout.volumes_dir) + os.sep):
                shutil.rmtree(path, ignore_errors=True)
            log.info("deleted %s: its claim is gone", meta["name"])
