"""Every restart and every logged error of the operator's and the servers' pods during the kind tier.

One watch on the cluster's pods, from the tier's first namespace to its last test, keeps for each
pod of the in-cluster operator (namespace tfdata-system) and of every TFDataService in the tier's
namespaces (label app.kubernetes.io/name=tfdata-service) its restart counts, how its containers last exited, and
the error lines of its logs. Each container instance's log is followed from the moment the watch
sees it run until it exits, so what a pod logs while it is deleted (by a test, a scale-down, a
namespace going away) is read too; an instance that came and went unseen between two events of a
crash loop is read afterwards (``previous``). A deleted pod is not a restart: its replacement is
another pod, counted from zero.

A restart or an error line a test provokes on purpose, the test declares with ``expect``: which
pods, why, and the pattern its error lines match. ``problems`` lists everything else.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

OPERATOR_NAMESPACE = "tfdata-system"
SERVER_NAME_LABEL = ("app.kubernetes.io/name", "tfdata-service")
# An error as each program logs it: the servers' "<time> ERROR tfdata-server: ...", kopf's `full`
# format "[<time>] kopf.objects [ERROR   ] ...", TensorFlow's C++ (absl) "E1125 09:00:00.000000 ..."
# and fatal "F..." lines, and a Python traceback (kept with the lines that follow it). kopf's `json`
# format (the chart's default) is one object a line: its severity says, and a traceback is inside.
ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b|^[EF]\d{4} \d\d:\d\d:")
SEVERE = frozenset({"error", "critical", "fatal"})
TRACEBACK = "Traceback (most recent call last)"
# A container the runtime could not start, before any of our code ran: runc failing to freeze the
# container's cgroup while it sets it up, which a node under heavy load does now and then (seen in
# the kind tier beside the dev lane's tiers, load 18: "runc create failed: ... error setting cgroup
# config for procHooks process: unable to freeze"); the kubelet starts it again. Only this one
# runtime failure is not counted as a restart: a StartError of another kind (a missing executable,
# a bad mount) is ours, and is.
RUNTIME_START_FAILURE = re.compile(r"runc create failed: .*unable to freeze")
TRACEBACK_MAX_LINES = 60
WATCH_SECONDS = 60  # each watch request; the next resumes from the last resourceVersion


@dataclass(frozen=True)
class Expected:
    """Restarts or error lines a test provokes on purpose, in the pods of ``namespace`` whose
    names fully match ``pod`` (and, with ``uids``, only those pods: not the ones a StatefulSet makes
    under the same name to replace them)."""

    namespace: str
    pod: re.Pattern[str]
    why: str
    restarts: bool
    errors: re.Pattern[str] | None
    uids: frozenset[str] | None = None
    unread: bool = False  # logs that could not be read (their node stopped answering)

    def covers(self, pod: PodRecord) -> bool:
        return (
            pod.namespace == self.namespace
            and self.pod.fullmatch(pod.name) is not None
            and (self.uids is None or pod.uid in self.uids)
        )


@dataclass(frozen=True)
class LoggedError:
    container: str
    instance: int  # the container's restartCount when this instance ran
    text: str  # one line, or a traceback with the lines that follow it


@dataclass
class PodRecord:
    namespace: str
    name: str
    uid: str
    what: str  # "the operator" or "<component> of <instance>"
    restarts: dict[str, int] = field(default_factory=dict)  # container -> highest restartCount seen
    last_exits: dict[str, str] = field(default_factory=dict)  # container -> how it last exited
    # container -> the instances the runtime failed to start (RUNTIME_START_FAILURE), not counted
    runtime_failures: dict[str, set[str]] = field(default_factory=dict)
    read: set[str] = field(default_factory=set)  # the IDs of the container instances whose log is read
    errors: list[LoggedError] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # logs that could not be read, and why
    deleting: bool = False
    gone: bool = False
    followers: list[threading.Thread] = field(default_factory=list)

    def __str__(self) -> str:
        return f"pod {self.namespace}/{self.name} ({self.what})"


def tracked(pod: dict[str, Any], namespaces: set[str]) -> str | None:
    """What a pod is, when it is one this module watches: the operator's, or a server's in one of
    the tier's ``namespaces``."""
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    if meta["namespace"] == OPERATOR_NAMESPACE:
        return "the operator"
    if meta["namespace"] in namespaces and labels.get(SERVER_NAME_LABEL[0]) == SERVER_NAME_LABEL[1]:
        return f"{labels.get('app.kubernetes.io/component')} of {labels.get('app.kubernetes.io/instance')}"
    return None


def on_frozen_node(namespace: str, pods: dict[str, str], why: str) -> Expected:
    """What a node that stops answering does to the pods (uid: name) it runs: they may restart once
    it is back, log errors, and their logs may not be read. Those pods only, by uid."""
    names = re.compile("|".join(re.escape(n) for n in sorted(set(pods.values()))))
    return Expected(namespace, names, why, True, re.compile(""), uids=frozenset(pods), unread=True)


def error_lines(lines: Iterable[str]) -> Iterator[str]:
    """The error lines of a log; a traceback comes as one text with the lines after it, up to the
    first that is not indented (the exception itself)."""
    block: list[str] | None = None
    for line in lines:
        line = line.rstrip("\n")
        if block is not None:
            block.append(line)
            if (line and not line[0].isspace()) or len(block) >= TRACEBACK_MAX_LINES:
                yield "\n".join(block)
                block = None
            continue
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                if str(record.get("severity", "")).lower() in SEVERE or TRACEBACK in line:
                    yield line
                continue
        if TRACEBACK in line:
            block = [line]
        elif ERROR_LINE.search(line):
            yield line
    if block is not None:
        yield "\n".join(block)


def _exit(terminated: dict[str, Any]) -> str:
    said = f"exit code {terminated.get('exitCode')}"
    if terminated.get("reason"):
        said += f" ({terminated['reason']})"
    if terminated.get("message"):
        said += f": {' '.join(str(terminated['message']).split())[:300]}"
    return f"{said} at {terminated.get('finishedAt')}"


# A log to read: (container, instance, previous).
Read = tuple[str, int, bool]


def update(record: PodRecord, pod: dict[str, Any], gone: bool) -> list[Read]:
    """Takes in what one event says of the pod (``gone``: it was deleted); returns the container
    instances whose logs are to be read now. The kubelet's log endpoint serves the current instance
    (running, or the one that ended last) and the previous one (lastState): each is read once, by
    its container ID, the current one followed to its end."""
    record.deleting = record.deleting or bool(pod["metadata"].get("deletionTimestamp"))
    record.gone = record.gone or gone
    reads: list[Read] = []
    status = pod.get("status") or {}
    # Init containers too (the injector of spec.serverProgram Injected): one that fails is restarted
    # by the kubelet and logs like any container, and the pod never starts its servers meanwhile.
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        name, count = container["name"], int(container.get("restartCount") or 0)
        record.restarts[name] = max(count, record.restarts.get(name, 0))
        state = container.get("state") or {}
        current = container.get("containerID") if ("running" in state or "terminated" in state) else None
        if current and current not in record.read:
            record.read.add(current)
            reads.append((name, count, False))
        last = (container.get("lastState") or {}).get("terminated")
        if last:
            record.last_exits[name] = _exit(last)
            if last.get("reason") == "StartError" and RUNTIME_START_FAILURE.search(str(last.get("message") or "")):
                key = str(last.get("containerID") or last.get("finishedAt"))
                record.runtime_failures.setdefault(name, set()).add(key)
            if last.get("containerID") and last["containerID"] not in record.read:
                record.read.add(last["containerID"])
                reads.append((name, max(count - 1, 0), True))
    return reads


def problems(pods: list[PodRecord], expected: list[Expected]) -> list[str]:
    """One paragraph per pod with a restart, an error line or an unread log that no expectation covers."""
    found = []
    for pod in sorted(pods, key=lambda r: (r.namespace, r.name, r.uid)):
        covering = [e for e in expected if e.covers(pod)]
        lines = []
        restarts = {c: n - len(pod.runtime_failures.get(c, ())) for c, n in pod.restarts.items()}
        restarts = {c: n for c, n in restarts.items() if n > 0}
        if restarts and not any(e.restarts for e in covering):
            exits = "; ".join(f"{c} last: {pod.last_exits.get(c, '?')}" for c in restarts)
            lines.append(f"restarted {restarts} ({exits})")
        for error in pod.errors:
            if not any(e.errors is not None and e.errors.search(error.text) for e in covering):
                lines.append(f"{error.container} #{error.instance} logged: {error.text}")
        if not any(e.unread for e in covering):
            lines += pod.unread
        if lines:
            why = "".join(f"\n    (expected by a test: {e.why})" for e in covering)
            found.append(f"{pod}:{why}\n  " + "\n  ".join(lines))
    return found


class PodHealth:
    """The watch and what it saw; ``start`` it before the first test, ``problems`` after the last."""

    def __init__(self, kubeconfig: Path) -> None:
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        # One connection per followed log, beside the watch.
        configuration.connection_pool_maxsize = 64
        self.core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))
        self.pods: dict[str, PodRecord] = {}  # by uid
        self.namespaces: set[str] = set()  # the tier's, whose server pods are watched
        self.expected: list[Expected] = []
        self.watch_failures: list[str] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.synced = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="pod-health-watch", daemon=True)

    def start(self, timeout: float = 60) -> None:
        """Starts the watch; returns once it has listed the pods that exist now."""
        self.thread.start()
        if not self.synced.wait(timeout):
            raise AssertionError(f"the pod watch listed no pods in {timeout:.0f}s: {self.watch_failures}")

    def stop(self) -> None:
        self.stopping.set()

    def add_namespace(self, namespace: str) -> None:
        """Watches the server pods of a namespace the tier made (before it makes any pod there)."""
        with self.lock:
            self.namespaces.add(namespace)

    def expect(self, namespace: str, pod: str, why: str, restarts: bool = False, errors: str | None = None) -> None:
        """Declares restarts (``restarts``) and error lines matching ``errors`` (a regular expression
        searched in each line or traceback) of the pods in ``namespace`` whose names fully match ``pod``."""
        pattern = re.compile(errors) if errors is not None else None
        with self.lock:
            self.expected.append(Expected(namespace, re.compile(pod), why, restarts, pattern))

    def expect_frozen(self, namespace: str, pods: dict[str, str], why: str) -> None:
        """Declares everything of the pods ``pods`` (uid: name) of ``namespace`` on a node a test
        freezes: restarts, error lines, logs that cannot be read. Only those pods, by uid: their
        replacements, under the same names, are checked as any pod."""
        if pods:
            with self.lock:
                self.expected.append(on_frozen_node(namespace, pods, why))

    # --- the watch -------------------------------------------------------------------------

    def _watch(self) -> None:
        version: str | None = None
        while not self.stopping.is_set():
            try:
                if version is None:
                    version = self._list()
                    self.synced.set()
                stream = kubernetes.watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=version,
                    timeout_seconds=WATCH_SECONDS,
                    allow_watch_bookmarks=True,
                    deserialize=False,
                )
                for event in stream:
                    pod = event["object"]
                    version = pod["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._saw(pod, gone=event["type"] == "DELETED")
                    if self.stopping.is_set():
                        return
            except ApiException as exc:
                if exc.status == 410:  # too old to resume from: list again
                    version = None
                    continue
                self._failed(f"the pod watch failed: {exc.status} {exc.reason}")
            except Exception as exc:  # a dropped connection: resume from the last version
                self._failed(f"the pod watch broke: {type(exc).__name__}: {exc}")

    def _failed(self, why: str) -> None:
        with self.lock:
            self.watch_failures.append(why)
        time.sleep(1)

    def _list(self) -> str:
        """Lists every pod; those known alive but not listed went while no watch ran."""
        listed = json.loads(self.core.list_pod_for_all_namespaces(_preload_content=False).data)
        present = set()
        for pod in listed["items"]:
            present.add(pod["metadata"]["uid"])
            self._saw(pod, gone=False)
        with self.lock:
            for record in self.pods.values():
                if record.uid not in present and not record.gone:
                    record.gone = True
                    record.unread.append("it went while the watch was reconnecting: its last moments are unknown")
        return str(listed["metadata"]["resourceVersion"])

    def _saw(self, pod: dict[str, Any], gone: bool) -> None:
        meta = pod["metadata"]
        with self.lock:
            what = tracked(pod, self.namespaces)
            if what is None:
                return
            record = self.pods.setdefault(meta["uid"], PodRecord(meta["namespace"], meta["name"], meta["uid"], what))
            for read in update(record, pod, gone):
                thread = threading.Thread(target=self._scan, args=(record, *read), name=record.name, daemon=True)
                record.followers.append(thread)
                thread.start()

    def _scan(self, record: PodRecord, container: str, instance: int, previous: bool) -> None:
        which = f"{container} (instance {instance}{', previous' if previous else ''})"
        try:
            # Watch.stream follows a log (follow=true) until the container ends.
            lines = kubernetes.watch.Watch().stream(
                self.core.read_namespaced_pod_log, record.name, record.namespace, container=container, previous=previous
            )
            for text in error_lines(lines):
                with self.lock:
                    if all((e.container, e.text) != (container, text) for e in record.errors):
                        record.errors.append(LoggedError(container, instance, text))
        except ApiException as exc:
            with self.lock:
                record.unread.append(f"the log of {which} could not be read: {exc.status} {exc.reason} {exc.body}")
        except Exception as exc:
            with self.lock:
                record.unread.append(f"reading the log of {which} broke: {type(exc).__name__}: {exc}")

    # --- after the last test ---------------------------------------------------------------

    def settle(self, timeout: float) -> list[str]:
        """Waits until every pod being deleted is gone and its logs are read to their end; returns
        the pods still going (after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                ending = [r for r in self.pods.values() if r.deleting or r.gone]
                going = [str(r) for r in ending if not r.gone or any(t.is_alive() for t in r.followers)]
            if not going or time.monotonic() > deadline:
                return going
            time.sleep(1)

    def problems(self) -> list[str]:
        """``problems`` of what the watch saw, and the watch's own failure if it ended early."""
        with self.lock:
            found = problems(list(self.pods.values()), self.expected)
            if not self.thread.is_alive() and not self.stopping.is_set():
                found.insert(0, f"the pod watch ended early: {self.watch_failures}")
        return found

    def summary(self) -> str:
        with self.lock:
            pods = list(self.pods.values())
            logs = sum(len(r.read) for r in pods)
            restarts = sum(n for r in pods for n in r.restarts.values())
            runtime = sum(len(ids) for r in pods for ids in r.runtime_failures.values())
            errors = sum(len(r.errors) for r in pods)
            reconnects = len(self.watch_failures)
        return (
            f"{len(pods)} pods watched ({sum(r.what == 'the operator' for r in pods)} of the operator), "
            f"{logs} container logs read, {restarts} restarts ({runtime} of them the runtime failing to "
            f"start a container: not counted), {errors} error lines or tracebacks, "
            f"{len(self.expected)} expectations declared by tests, {reconnects} watch reconnects"
        )
