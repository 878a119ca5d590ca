"""Everything a kubelet does for one pod: volumes, a network namespace with an IP on the
bridge, its containers, probes, status reports and graceful deletion."""

from __future__ import annotations

import base64
import contextlib
import functools
import http.client
import logging
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from .api import ApiError, Obj, timestamp
from .containers import Container, Probe, env_from
from .hosts import write_hosts
from .network import IP, kill_netns

if TYPE_CHECKING:
    from .agent import Agent

TICK_SECONDS = 0.25

log = logging.getLogger("nodeagent")


@functools.cache
def probe_opener() -> urllib.request.OpenerDirector:
    """The HTTP probes' opener, one for the node: a TLS context costs tens of milliseconds of CPU to
    build, and one per probe made the node's probes of a few dozen pods take a core from their servers."""
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE  # kubelets do not verify either
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls))


class PodRunner(threading.Thread):
    """Everything a kubelet does for one pod (one uid), in a thread of its own."""

    def __init__(self, agent: Agent, pod: Obj) -> None:
        self.key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        super().__init__(name=self.key, daemon=True)
        self.agent = agent
        self.pod = pod  # the latest seen; replaced by the agent's loop
        self.uid: str = pod["metadata"]["uid"]
        self.dir_name = f"{pod['metadata']['namespace']}_{pod['metadata']['name']}"
        self.dir = agent.layout.pods_dir / self.dir_name
        self.ip: str | None = None
        self.netns = ""
        self.stop_request: tuple[float, bool] | None = None  # (grace seconds, delete the Pod afterwards)
        self.message = ""
        self.start_time = pod.get("status", {}).get("startTime") or timestamp()
        self.transitions: dict[str, tuple[str, str]] = {}
        self.reported: Obj | None = None
        self.volumes: dict[str, str] = {}  # volume name -> host directory
        previous = {c["name"]: c.get("restartCount", 0) for c in pod.get("status", {}).get("containerStatuses", [])}
        # An agent restarted while the pod ran starts its containers again: that counts as a restart.
        self.containers = [
            Container(self, c, previous.get(c["name"], 0) + (c["name"] in previous)) for c in pod["spec"]["containers"]
        ]
        for kind in ("initContainers", "ephemeralContainers"):
            if pod["spec"].get(kind):
                log.warning("%s: %s are not supported; ignored", self.key, kind)

    def request_stop(self, grace: float, delete: bool) -> None:
        if self.stop_request is None:
            self.stop_request = (grace, delete)

    def run(self) -> None:
        delete = False
        try:
            if self._prepare():
                self._run_containers()
            grace, delete = self.stop_request or (0.0, False)
            self._stop_containers(grace)
        except Exception:
            log.exception("%s: failed", self.key)
        finally:
            self._teardown()
        if delete:
            ns, name = self.pod["metadata"]["namespace"], self.pod["metadata"]["name"]
            with contextlib.suppress(ApiError):  # gone already, or a newer pod of that name: not ours
                self.agent.api.call(
                    "DELETE", f"/api/v1/namespaces/{ns}/pods/{name}",
                    {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
                )  # fmt: skip
            log.info("%s: deleted the pod", self.key)

    def _prepare(self) -> bool:
        """Volumes and network; waits (Pending, with a message) while a claim is unbound."""
        while self.stop_request is None:
            try:
                self.volumes = self._resolve_volumes()
                for c in self.containers:
                    c.env_from = env_from(c.spec, self._get_object)
                break
            except LookupError as e:
                self.message = str(e)
                self.report()
                time.sleep(1)
        if self.stop_request is not None:
            return False
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ip = self.agent.network.allocate(self.key, in_use=set(self.agent.runners))
        self.netns = self.agent.layout.netns(self.ip)
        self.agent.network.add(self.netns, self.ip)
        write_hosts(self.netns, self.agent.hosts_for(self.pod["metadata"]["namespace"]))
        self.message = ""
        for c in self.containers:
            c.env = c._env()
        log.info("%s: sandbox ready: %s in netns %s", self.key, self.ip, self.netns)
        return True

    def _get_object(self, kind: str, name: str) -> Obj | None:
        return self.agent.api.get(f"/api/v1/namespaces/{self.pod['metadata']['namespace']}/{kind}/{name}")

    def _resolve_volumes(self) -> dict[str, str]:
        ns = self.pod["metadata"]["namespace"]
        found: dict[str, str] = {}
        for vol in self.pod["spec"].get("volumes", []):
            name = vol["name"]
            local = self.dir / "volumes" / name
            if "emptyDir" in vol:
                local.mkdir(parents=True, exist_ok=True)
                found[name] = str(local)
            elif "hostPath" in vol:
                found[name] = vol["hostPath"]["path"]
            elif "configMap" in vol or "secret" in vol:
                kind, ref = ("configmaps", vol["configMap"]) if "configMap" in vol else ("secrets", vol["secret"])
                obj = self._get_object(kind, ref.get("name") or ref.get("secretName"))
                if obj is None:
                    if ref.get("optional"):
                        continue
                    raise LookupError(
                        f"{kind[:-1]} {ref.get('name') or ref.get('secretName')} of volume {name} not found"
                    )
                self._write_files(local, obj, ref.get("items"), binary=kind == "secrets")
                found[name] = str(local)
            elif "persistentVolumeClaim" in vol:
                claim = vol["persistentVolumeClaim"]["claimName"]
                pvc = self.agent.api.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}")
                pv_name = (pvc or {}).get("spec", {}).get("volumeName")
                pv = self.agent.api.get(f"/api/v1/persistentvolumes/{pv_name}") if pv_name else None
                if pv is None or (pvc or {}).get("status", {}).get("phase") != "Bound":
                    raise LookupError(f"claim {claim} of volume {name} is not bound yet")
                path = (pv["spec"].get("hostPath") or pv["spec"].get("local") or {}).get("path")
                if not path:
                    raise LookupError(f"volume {pv_name} of claim {claim} has no hostPath/local path")
                Path(path).mkdir(parents=True, exist_ok=True)
                found[name] = path
            else:
                log.warning(
                    "%s: volume %s: type %s is not supported; not mounted", self.key, name, sorted(set(vol) - {"name"})
                )
        return found

    @staticmethod
    def _write_files(directory: Path, obj: Obj, items: list[Obj] | None, binary: bool) -> None:
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()} if binary else {
            **{k: v.encode() for k, v in (obj.get("data") or {}).items()},
            **{k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()},
        }  # fmt: skip
        paths = {i["key"]: i["path"] for i in items} if items else {k: k for k in data}
        directory.mkdir(parents=True, exist_ok=True)
        for key, rel in paths.items():
            if key in data:
                (directory / rel).parent.mkdir(parents=True, exist_ok=True)
                (directory / rel).write_bytes(data[key])

    def mounts(self, container: Obj) -> list[tuple[str, str, bool]]:
        result = []
        for m in container.get("volumeMounts", []):
            if m["name"] in self.volumes:
                source = self.volumes[m["name"]]
                if m.get("subPath"):
                    source = os.path.join(source, m["subPath"])
                    Path(source).mkdir(parents=True, exist_ok=True)
                result.append((source, m["mountPath"], bool(m.get("readOnly"))))
        return result

    def _run_containers(self) -> None:
        while self.stop_request is None:
            now = time.monotonic()
            for c in self.containers:
                c.tick(now, may_start=True)
            self.report()
            time.sleep(TICK_SECONDS)

    def _stop_containers(self, grace: float) -> None:
        for c in self.containers:
            c.kill("the pod is being deleted" if grace else "stopped", grace)
        deadline = time.monotonic() + grace + 5
        while any(c.proc is not None for c in self.containers) and time.monotonic() < deadline:
            for c in self.containers:
                c.tick(time.monotonic(), may_start=False)
            time.sleep(0.1)

    def _teardown(self) -> None:
        if self.netns:
            kill_netns(self.netns)
        self.agent.cpu.remove(self.uid)
        shutil.rmtree(self.dir, ignore_errors=True)  # emptyDirs and configMap copies die with the pod

    def check(self, container: Container, probe: Probe) -> bool:
        spec = probe.spec
        try:
            if "httpGet" in spec:
                get = spec["httpGet"]
                host, port = get.get("host") or self.ip, self._port(container, get["port"])
                url = f"{get.get('scheme', 'HTTP').lower()}://{host}:{port}{get.get('path', '/')}"
                request = urllib.request.Request(
                    url, headers={h["name"]: h["value"] for h in get.get("httpHeaders", [])}
                )
                with probe_opener().open(request, timeout=probe.timeout) as response:
                    return 200 <= int(response.status) < 400
            if "tcpSocket" in spec:
                port = self._port(container, spec["tcpSocket"]["port"])
                with socket.create_connection((spec["tcpSocket"].get("host") or self.ip, port), timeout=probe.timeout):
                    return True
            if "exec" in spec:  # in the pod's network namespace, with the container's env
                argv = [IP, "netns", "exec", self.netns, *spec["exec"]["command"]]
                return (
                    subprocess.run(
                        argv, env=container.env, capture_output=True, timeout=probe.timeout, check=False
                    ).returncode
                    == 0
                )
        except (OSError, http.client.HTTPException, subprocess.TimeoutExpired):
            return False
        log.warning("%s: probe %s not supported; counted as passing", self.key, sorted(spec))
        return True

    @staticmethod
    def _port(container: Container, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in container.spec.get("ports", []):
            if p.get("name") == port:
                return int(p["containerPort"])
        raise OSError(f"no port named {port!r}")

    def _condition(self, kind: str, ok: bool, reason: str = "", message: str = "") -> Obj:
        status = "True" if ok else "False"
        if self.transitions.get(kind, ("", ""))[0] != status:
            self.transitions[kind] = (status, timestamp())
        condition = {
            "type": kind,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": self.transitions[kind][1],
        }
        if not ok and reason:
            condition.update(reason=reason, message=message)
        return condition

    def status(self) -> Obj:
        containers = [c.status() for c in self.containers]
        ready = all(c["ready"] for c in containers)
        if any(c.proc is not None or not c.finished for c in self.containers):
            phase = "Running" if any(c.runs for c in self.containers) else "Pending"
        else:
            phase = (
                "Succeeded"
                if all(c["state"].get("terminated", {}).get("exitCode") == 0 for c in containers)
                else "Failed"
            )
        scheduled = [c for c in self.pod.get("status", {}).get("conditions", []) if c["type"] == "PodScheduled"]
        not_ready = [c["name"] for c in containers if not c["ready"]]
        message = f"containers with unready status: [{' '.join(not_ready)}]"
        conditions = [
            *(scheduled or [self._condition("PodScheduled", True)]),
            self._condition("Initialized", self.ip is not None, "Waiting", self.message),
            self._condition("ContainersReady", ready, "ContainersNotReady", message),
            self._condition("Ready", ready, "ContainersNotReady", message),
        ]
        status: Obj = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": self.agent.network.gateway,
            "hostIPs": [{"ip": self.agent.network.gateway}],
            "startTime": self.start_time,
            "containerStatuses": containers,
        }
        if self.ip:
            status.update(podIP=self.ip, podIPs=[{"ip": self.ip}])
        return status

    def report(self) -> None:
        status = self.status()
        if status == self.reported:
            return
        ns, name = self.pod["metadata"]["namespace"], self.pod["metadata"]["name"]
        try:
            # A merge patch replaces lists whole: this writes all conditions and container statuses.
            self.agent.api.merge_patch(
                f"/api/v1/namespaces/{ns}/pods/{name}/status",
                {"metadata": {"uid": self.uid}, "status": status},  # the uid: never patch a newer pod of that name
            )
            self.reported = status
        except ApiError as e:
            if e.status not in (404, 409):
                log.warning("%s: status update failed: %s", self.key, e)
        except Exception as e:  # the API server restarting: try again next tick
            log.warning("%s: status update failed: %s", self.key, e)
