"""One container of a pod as a local process: its command line and environment, the
mounts of its volumes, its probes, restarts and status. The project's Python environment
stands in for the image (`default_venv_bin`)."""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .api import Obj, timestamp
from .network import IP

if TYPE_CHECKING:
    from .pods import PodRunner

REPO = Path(__file__).resolve().parents[2]
BACKOFF_MAX_SECONDS = 10.0  # a kubelet backs off up to 5 minutes; tests cannot wait that long

log = logging.getLogger("nodeagent")


def default_venv_bin() -> Path:
    """What stands in for every image: the project's venv (first on a container's PATH)."""
    venv = REPO / ".venv" / "bin"
    return venv if (venv / "python").exists() else Path(sys.executable).parent


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined variables are replaced, `$$` is a literal `$`,
    and an undefined `$(VAR)` stays as written."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            end = text.find(")", i + 2) if text[i + 1] == "(" else -1
            if end != -1:
                out.append(env.get(text[i + 2 : end], text[i : end + 1]))
                i = end + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


def env_from(container: Obj, get: Callable[[str, str], Obj | None]) -> dict[str, str]:
    """A container's `envFrom` as a kubelet reads it: each ConfigMap's or Secret's keys (after
    `prefix`), in order, a later source winning; `get(kind, name)` fetches the object. A missing
    source that is not `optional` raises LookupError, and the pod waits for it."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        kind, ref = (
            ("configmaps", source["configMapRef"]) if "configMapRef" in source else ("secrets", source.get("secretRef"))
        )
        if ref is None:
            continue
        obj = get(kind, ref["name"])
        if obj is None:
            if ref.get("optional"):
                continue
            raise LookupError(f"{kind[:-1]} {ref['name']} of container {container['name']}'s envFrom not found")
        raw: dict[str, str] = obj.get("data") or {}
        data = {k: base64.b64decode(v).decode() for k, v in raw.items()} if kind == "secrets" else raw
        for key, value in data.items():
            if "=" in key:  # not a name a process environment can hold; a kubelet skips it too
                continue
            env[source.get("prefix", "") + key] = value
    return env


def field_ref(pod: Obj, path: str, ip: str, host_ip: str) -> str | None:
    meta, spec = pod["metadata"], pod["spec"]
    simple = {
        "metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
        "spec.nodeName": spec.get("nodeName", ""), "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": ip, "status.podIPs": ip, "status.hostIP": host_ip, "status.hostIPs": host_ip,
    }  # fmt: skip
    if path in simple:
        return simple[path]
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    return meta.get(m.group(1), {}).get(m.group(2), "") if m else None


class Probe:
    """One probe's schedule and consecutive results."""

    def __init__(self, spec: Obj) -> None:
        self.spec = spec
        self.period = spec.get("periodSeconds", 10)
        self.timeout = spec.get("timeoutSeconds", 1)
        self.success_threshold = spec.get("successThreshold", 1)
        self.failure_threshold = spec.get("failureThreshold", 3)
        self.reset(time.monotonic())

    def reset(self, now: float) -> None:
        self.next_at = now + self.spec.get("initialDelaySeconds", 0)
        self.successes = self.failures = 0

    def due(self, now: float) -> bool:
        if now < self.next_at:
            return False
        self.next_at = now + self.period
        return True

    def record(self, ok: bool) -> None:
        self.successes, self.failures = (self.successes + 1, 0) if ok else (0, self.failures + 1)

    @property
    def succeeded(self) -> bool:
        return self.successes >= self.success_threshold

    @property
    def failed(self) -> bool:
        return self.failures >= self.failure_threshold


class Container:
    """One container of a pod: its process, restarts and probes."""

    def __init__(self, pod: PodRunner, spec: Obj, restart_count: int) -> None:
        self.pod = pod
        self.spec = spec
        self.name: str = spec["name"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.restart_count = restart_count
        self.runs = 0
        self.state: Obj = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: Obj = {}
        self.next_start = 0.0
        self.started = self.ready = self.finished = False
        self.kill_deadline: float | None = None
        self.kill_reason = ""
        self.probes = {
            k: Probe(spec[f"{k}Probe"]) for k in ("startup", "liveness", "readiness") if spec.get(f"{k}Probe")
        }
        self.log_path = pod.agent.layout.logs_dir / pod.dir_name / f"{self.name}.log"
        self.env: dict[str, str] = {}  # once the pod has its IP (fieldRef status.podIP)
        self.env_from: dict[str, str] = {}  # read with the pod's volumes

    def _env(self) -> dict[str, str]:
        pod, agent = self.pod.pod, self.pod.agent
        env = {
            "PATH": f"{agent.venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOSTNAME": pod["spec"].get("hostname") or pod["metadata"]["name"],
            "HOME": "/root",
            **self.env_from,  # then `env`, which wins over it, as with a kubelet
        }
        for var in self.spec.get("env", []):
            if "value" in var:
                env[var["name"]] = expand(var["value"], env)
            elif (ref := var.get("valueFrom", {}).get("fieldRef")) is not None:
                value = field_ref(pod, ref["fieldPath"], self.pod.ip or "", agent.network.gateway)
                if value is None:
                    log.warning(
                        "%s: fieldRef %s not supported; %s left unset", self.pod.key, ref["fieldPath"], var["name"]
                    )
                else:
                    env[var["name"]] = value
            elif "valueFrom" in var:
                log.warning("%s: env %s: only value and fieldRef are supported; left unset", self.pod.key, var["name"])
            else:
                env[var["name"]] = ""
        return env

    def argv(self) -> list[str] | None:
        if not self.spec.get("command"):
            return None  # the image's entrypoint: there is no image
        return [expand(a, self.env) for a in [*self.spec["command"], *self.spec.get("args", [])]]

    def start(self, now: float) -> None:
        argv = self.argv()
        if argv is None:
            self.state = {
                "waiting": {"reason": "CreateContainerError", "message": "the dev node runs no images: set command"}
            }
            self.finished = True
            return
        # `ip netns exec` enters the pod's network namespace and a new mount namespace
        # (slave to the host's, so nothing mounted inside leaks out) with the pod's hosts
        # file over /etc/hosts; the shell bind-mounts the volumes, then becomes the container.
        # Every source (and what stands in for the image: the venv, the repository) is opened
        # before anything is mounted and bound through /proc/$$/fd: a volume mounted over /tmp
        # must not hide the next one's source, or the venv, when the repository lives under /tmp.
        mounts = sorted(self.pod.mounts(self.spec), key=lambda m: len(Path(m[1]).parts))
        keep = sorted(
            str(k)
            for k in {REPO, self.pod.agent.venv_bin.parent.parent}
            if any(Path(t) == k or Path(t) in k.parents for _, t, _ in mounts)
        )
        sources = [source for source, _, _ in mounts] + keep
        script = ["set -e"] + [f"exec {10 + i}<{shlex.quote(src)}" for i, src in enumerate(sources)]
        targets = [(target, read_only) for _, target, read_only in mounts] + [(k, False) for k in keep]
        for i, (target, read_only) in enumerate(targets):
            q_dst = shlex.quote(target)
            # --no-canonicalize: mount(8) would otherwise resolve the fd's link to its path text,
            # which by now may name the covered place instead.
            script += [f"mkdir -p {q_dst}", f"mount --no-canonicalize --bind /proc/$$/fd/{10 + i} {q_dst}"]
            if read_only:
                script.append(f"mount -o remount,bind,ro {q_dst}")
        script += [f"exec {10 + i}<&-" for i in range(len(sources))]
        script += [f"cd {shlex.quote(self.spec.get('workingDir') or '/')}", 'exec "$@"']
        command = [IP, "netns", "exec", self.pod.netns, "bash", "-c", "\n".join(script), "bash", *argv]
        cgroup = self.pod.agent.cpu.container(self.pod.uid, self.name, self.spec.get("resources", {}))
        if cgroup is not None:
            # Into its cgroup before `ip netns exec`, which mounts a /sys of its own: every
            # process of the container inherits it.
            command = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup), *command]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(
                f"--- {timestamp()} dev node: started {self.name} (run {self.runs + 1}): {shlex.join(argv)}\n".encode()
            )
            out.flush()
            # A session of its own: its process group is what is killed when it ends.
            self.proc = subprocess.Popen(
                command, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.pod.dir, start_new_session=True,
            )  # fmt: skip
        if cgroup is not None:
            # And from here, before the container is reported running: the shell above may not
            # have been scheduled yet, and a kubelet reports a container once it is in its cgroup.
            self.pod.agent.cpu.enter(cgroup, self.proc.pid)
        if self.runs:
            self.restart_count += 1
        self.runs += 1
        self.state = {"running": {"startedAt": timestamp()}}
        self.started = "startup" not in self.probes
        self.ready = False
        self.kill_deadline, self.kill_reason = None, ""
        for probe in self.probes.values():
            probe.reset(now)
        log.info("%s: started container %s (pid %d)", self.pod.key, self.name, self.proc.pid)

    def kill(self, reason: str, grace: float) -> None:
        """SIGTERM to the main process, as a kubelet signals a container's PID 1 (the
        tfdata-server supervisor stops its TensorFlow child itself); SIGKILL to the whole
        group once `grace` has passed."""
        if self.proc is None or self.kill_deadline is not None:
            return
        log.info("%s: stopping container %s: %s", self.pod.key, self.name, reason)
        self.kill_reason = reason
        self.kill_deadline = time.monotonic() + grace
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)

    def tick(self, now: float, may_start: bool) -> None:
        if self.proc is not None:
            returncode = self.proc.poll()
            if returncode is None:
                if self.kill_deadline is not None:
                    if now > self.kill_deadline:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(self.proc.pid, signal.SIGKILL)
                else:
                    self._probe(now)
                return
            self._exited(returncode, now)
        if may_start and not self.finished and now >= self.next_start:
            self.start(now)

    def _exited(self, returncode: int, now: float) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):  # what it left running dies with it, as in a cgroup
            os.killpg(self.proc.pid, signal.SIGKILL)
        code = returncode if returncode >= 0 else 128 - returncode
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": self.state.get("running", {}).get("startedAt"),
            "finishedAt": timestamp(),
            "containerID": f"devnode://{self.proc.pid}",
        }
        if self.kill_reason:
            terminated["message"] = self.kill_reason
        log.info(
            "%s: container %s exited with %d%s",
            self.pod.key,
            self.name,
            code,
            f" ({self.kill_reason})" if self.kill_reason else "",
        )
        self.proc = None
        self.started = self.ready = False
        policy = self.pod.pod["spec"].get("restartPolicy", "Always")
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            backoff = min(2.0 ** min(self.runs - 1, 4), BACKOFF_MAX_SECONDS)
            self.next_start = now + backoff
            self.last_state = {"terminated": terminated}
            self.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {backoff:.0f}s restarting container {self.name}",
                }
            }
        else:
            self.state = {"terminated": terminated}
            self.finished = True

    def _probe(self, now: float) -> None:
        grace = float(self.pod.pod["spec"].get("terminationGracePeriodSeconds", 30))
        if not self.started:
            startup = self.probes["startup"]
            if startup.due(now):
                startup.record(self.pod.check(self, startup))
            if startup.succeeded:
                self.started = True
                for kind in ("liveness", "readiness"):
                    if kind in self.probes:
                        self.probes[kind].reset(now)
            elif startup.failed:
                self.kill("Startup probe failed", grace)
            return
        liveness = self.probes.get("liveness")
        if liveness is not None and liveness.due(now):
            liveness.record(self.pod.check(self, liveness))
            if liveness.failed:
                self.kill("Liveness probe failed", grace)
                return
        readiness = self.probes.get("readiness")
        if readiness is None:
            self.ready = True
        elif readiness.due(now):
            readiness.record(self.pod.check(self, readiness))
            self.ready = readiness.succeeded or (self.ready and not readiness.failed)

    def status(self) -> Obj:
        return {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "containerID": f"devnode://{self.proc.pid}" if self.proc else "",
            "ready": self.ready,
            "started": self.started and self.proc is not None,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
