"""Real tf.data service pods read by real TensorFlow clients: sharding, faults, scaling, errors.

Every service here is a TFDataService the operator turns into pods that the dev node runs
as `tfdata-server` processes; the clients (tests/e2e/clients/read_dataset.py) read a
TFRecord dataset of several files through `status.dispatcherAddress`. Every read has a
timeout (the client's watchdog), so a hang fails fast with what was read so far.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tfdata_operator.render import builders

from devcluster import node as nodeagent
from fixtures.manifests import API_VERSION
from fixtures.support import ROOT, Kubectl, OperatorProcess, WorkerCounts, stalled_on_idle_workers_said, wait_for

CLIENTS = Path(__file__).resolve().parent / "clients"
FILES, RECORDS = 6, 40
ALL = [f"f{f}-r{r}" for f in range(FILES) for r in range(RECORDS)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """TFRecord files where the worker processes can read them (not /tmp: pods get their own)."""
    directory = ROOT / ".local" / f"e2e-data-{tmp_path_factory.getbasetemp().name}"
    for name, files in (("many", FILES), ("one", 1)):
        subprocess.run(
            [sys.executable, str(CLIENTS / "make_dataset.py"), str(directory / name), f"--files={files}",
             f"--records={RECORDS}"],
            check=True, capture_output=True,
        )  # fmt: skip
    yield directory
    subprocess.run(["rm", "-rf", str(directory)], check=False)


@dataclass
class Read:
    """What a client read: elements in arrival order, and how it ended."""

    elements: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # when each element arrived (monotonic)
    ends: list[int] = field(default_factory=list)  # how many elements had arrived when each read (job) ended
    error: str | None = None
    returncode: int | None = None
    stderr: str = ""
    iterating: float | None = None  # when the client was about to call its first next() (monotonic)

    def counts(self) -> Counter[str]:
        return Counter(self.elements)

    def describe(self) -> str:
        return (
            f"read {len(self.elements)} elements, rc={self.returncode}, error={self.error!r}\n"
            f"stderr tail: {self.stderr[-2000:]}"
        )


class Reader:
    """A client process in its own network namespace, read line by line while it runs."""

    def __init__(self, state_dir: Path, namespace: str, *argv: str) -> None:
        self.state_dir, self.namespace, self.argv = state_dir, namespace, argv
        self.read = Read()
        self._netns = nodeagent.client_netns(state_dir, namespace)

    def __enter__(self) -> Reader:
        prefix = self._netns.__enter__()
        self.proc = subprocess.Popen(
            [*prefix, "python", str(CLIENTS / "read_dataset.py"), *self.argv],
            env=nodeagent.client_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._out = threading.Thread(target=self._stdout, daemon=True)
        self._err = threading.Thread(target=self._stderr, daemon=True)
        self._out.start()
        self._err.start()
        return self

    def _stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, _, value = line.rstrip("\n").partition(" ")
            if kind == "element":
                self.read.elements.append(value)
                self.read.times.append(time.monotonic())
            elif kind == "read":
                self.read.ends.append(len(self.read.elements))
            elif kind == "error":
                self.read.error = value
            elif kind == "iterating":
                self.read.iterating = time.monotonic()

    def _stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.read.stderr = (self.read.stderr + line)[-20000:]

    def wait_elements(self, count: int, timeout: float = 120) -> None:
        wait_for(
            lambda: len(self.read.elements) >= count or self.proc.poll() is not None,
            timeout,
            f"the client to read {count} elements",
            show=self.read.describe,
        )
        assert self.proc.poll() is None, f"the client ended early: {self.read.describe()}"

    def finish(self, timeout: float = 240) -> Read:
        try:
            self.read.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the client ran over {timeout:.0f}s: {self.read.describe()}") from None
        self._out.join(10)
        self._err.join(10)
        return self.read

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._netns.__exit__(None, None, None)


class Services:
    """Creates TFDataServices in the test namespace and reads from them."""

    def __init__(self, kubectl: Kubectl, namespace: str, state_dir: Path, data: Path) -> None:
        self.kubectl, self.ns, self.state_dir, self.data = kubectl, namespace, state_dir, data

    def create(self, name: str, policy: str, replicas: int = 2, **spec: Any) -> str:
        self.apply(name, policy, replicas, **spec)
        return self.wait_ready(name)

    def apply(self, name: str, policy: str, replicas: int = 2, **spec: Any) -> None:
        body = {
            "apiVersion": API_VERSION,
            "kind": "TFDataService",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {"shardingPolicy": policy, "workers": {"replicas": replicas}, **spec},
        }
        self.kubectl.apply(body)

    def wait_ready(self, name: str) -> str:
        waited = self.kubectl.run(
            "wait", "--for=condition=Ready", f"tfdata/{name}", "-n", self.ns, "--timeout=300s", check=False, timeout=310
        )
        assert waited.returncode == 0, f"{waited.stderr}\n{self.describe(name)}"
        return str(self.get(name)["status"]["dispatcherAddress"])

    def get(self, name: str) -> dict[str, Any]:
        return dict(self.kubectl.json("get", "tfdata", name, "-n", self.ns))

    def describe(self, name: str) -> str:
        pods = self.kubectl.run("get", "tfdata,pods,pvc", "-n", self.ns, "-o", "wide", check=False).stdout
        return f"{pods}\nstatus: {json.dumps(self.get(name).get('status'), indent=1)}"

    def delete(self, *names: str) -> None:
        """Deletes the services and waits for their pods, so TensorFlow processes don't pile up."""
        self.kubectl.run("delete", "tfdata", *names, "-n", self.ns, "--wait=true", "--timeout=60s", timeout=70)
        selector = f"app.kubernetes.io/instance in ({','.join(names)})"
        wait_for(
            lambda: not self.kubectl.json("get", "pods", "-n", self.ns, "-l", selector)["items"],
            90,
            f"the pods of {', '.join(names)} to stop",
        )

    def reader(self, address: str, mode: str, files: str = "many", *extra: str) -> Reader:
        pattern = str(self.data / files / "*.tfrecord")
        return Reader(self.state_dir, self.ns, "--service", address, "--files", pattern, "--mode", mode, *extra)

    def read(self, address: str, mode: str, files: str = "many", *extra: str, timeout: float = 150) -> Read:
        with self.reader(address, mode, files, f"--timeout={timeout - 10:.0f}", *extra) as reader:
            return reader.finish(timeout)

    def journal(self, name: str) -> str:
        """The work_dir the dispatcher's pod template gives it."""
        sts = self.kubectl.json("get", "statefulset", f"{name}-dispatcher", "-n", self.ns)
        return str((builders.read_config(sts) or {}).get("work_dir"))

    def pod(self, name: str) -> dict[str, Any]:
        return dict(self.kubectl.json("get", "pod", name, "-n", self.ns))

    def wait_replaced(self, name: str, uid: str, timeout: float = 60) -> None:
        """Until a pod of this name with another uid exists (the StatefulSet recreates it once the old one is gone)."""

        def uids() -> list[str]:
            pods = self.kubectl.json("get", "pods", "-n", self.ns, "--field-selector", f"metadata.name={name}")
            return [p["metadata"]["uid"] for p in pods["items"]]

        wait_for(lambda: any(u != uid for u in uids()), timeout, f"{name} replaced", show=lambda: self.describe(name))

    def runs(self, pod: str, container: str) -> list[str]:
        """The container's log, one entry per start, across every pod of this name (the dev node appends)."""
        path = self.state_dir / "logs" / "pods" / f"{self.ns}_{pod}" / f"{container}.log"
        assert path.exists(), f"no log of {pod}/{container} at {path}"
        runs = path.read_text(errors="replace").split("\n--- ")
        return [run for run in runs if run.strip()]

    def delete_pod(self, name: str) -> str:
        uid = self.pod(name)["metadata"]["uid"]
        self.kubectl.run("delete", "pod", name, "-n", self.ns, "--wait=false")
        return str(uid)


@pytest.fixture(scope="module")
def services(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, node_state_dir: Path, dataset: Path
) -> Iterator[Services]:
    yield Services(kubectl, namespace, node_state_dir, dataset)


def test_all_policies_share_out_the_dataset_as_documented(services: Services) -> None:
    """DYNAMIC, FILE, DATA, FILE_OR_DATA: each element exactly once; "OFF": once per worker; HINT via shard hints.

    Three services at a time, each read by its own client while the others are read: services
    of one namespace are independent, and waiting for each in turn took 105 s of the tier (73 s now;
    all six at once took as long: the two cores are the limit)."""
    for batch in (("DYNAMIC", "FILE", "DATA"), ("FILE_OR_DATA", "OFF", "HINT")):
        names = {policy: "p-" + policy.lower().replace("_", "-") for policy in batch}
        for policy, name in names.items():
            services.apply(name, policy)
        addresses = {policy: services.wait_ready(name) for policy, name in names.items()}
        with contextlib.ExitStack() as stack:
            readers = {
                policy: stack.enter_context(
                    services.reader(address, policy, "many", "--timeout=140", *(["--hint"] if policy == "HINT" else []))
                )
                for policy, address in addresses.items()
            }
            reads = {policy: reader.finish(150) for policy, reader in readers.items()}
        for policy, read in reads.items():
            assert read.returncode == 0, f"{policy}: {read.describe()}"
            copies = 2 if policy == "OFF" else 1
            assert read.counts() == Counter(ALL * copies), f"{policy}: {read.describe()}"
        services.delete(*names.values())


def test_deleting_the_dispatcher_mid_epoch_loses_and_repeats_nothing(services: Services) -> None:
    address = services.create("ft", "DYNAMIC", dispatcher={"faultTolerantMode": True})
    with services.reader(address, "DYNAMIC", "many", "--delay=0.05", "--timeout=200") as reader:
        reader.wait_elements(30)
        old = services.delete_pod("ft-dispatcher-0")
        services.wait_replaced("ft-dispatcher-0", old)
        at_restart = len(reader.read.elements)
        read = reader.finish(220)
    assert 0 < at_restart < len(ALL), f"the dispatcher was not replaced mid-epoch: {at_restart} elements read by then"
    assert read.returncode == 0, read.describe()
    assert read.counts() == Counter(ALL), read.describe()
    restarted = services.pod("ft-dispatcher-0")
    assert restarted["status"]["containerStatuses"][0]["ready"]
    # TensorFlow's own word (dispatcher_impl.cc, Start): the first run found no journal, the
    # replacement replayed the one the first run wrote.
    runs = services.runs("ft-dispatcher-0", "dispatcher")
    assert len(runs) >= 2, f"expected the logs of two dispatcher runs, found {len(runs)}"
    assert "No journal found. Starting dispatcher from new state." in runs[0], runs[0][-3000:]
    assert "Restored from journal in" in runs[-1], runs[-1][-3000:]
    services.delete("ft")


def test_workers_restart_after_a_journal_less_dispatcher_restarts(services: Services) -> None:
    """Without faultTolerantMode a restarted dispatcher reuses task ids the running workers still
    hold: the operator replaces the workers that registered with its earlier run."""
    address = services.create("nojournal", "DYNAMIC", dispatcher={"faultTolerantMode": False})
    read = services.read(address, "DYNAMIC")  # the workers now hold tasks of this dispatcher run
    assert read.counts() == Counter(ALL), read.describe()
    workers = {name: services.pod(name)["metadata"]["uid"] for name in ("nojournal-worker-0", "nojournal-worker-1")}
    old = services.delete_pod("nojournal-dispatcher-0")
    wait_for(
        lambda: all(services.pod(name)["metadata"]["uid"] != uid for name, uid in workers.items()),
        180,
        "both workers replaced after the dispatcher restarted",
        show=lambda: services.describe("nojournal"),
    )
    assert services.pod("nojournal-dispatcher-0")["metadata"]["uid"] != old
    services.wait_ready("nojournal")
    read = services.read(address, "DYNAMIC")
    assert read.counts() == Counter(ALL), read.describe()
    services.delete("nojournal")


def _files_of(elements: list[str] | set[str]) -> set[str]:
    return {element.split("-")[0] for element in elements}


def _delete_worker_mid_read(services: Services, reader: Reader, pod: str) -> list[str]:
    """Deletes a worker while the client reads; returns what the client had read once the worker was gone.

    The StatefulSet creates the replacement only after the old pod's processes have ended, so a
    new uid means the worker is dead. The client must still be reading then: the worker died with
    a split (DYNAMIC) or its shard (FILE) in flight, not after the epoch.
    """
    reader.wait_elements(30)
    old = services.delete_pod(pod)
    services.wait_replaced(pod, old)
    at_death = list(reader.read.elements)
    assert reader.proc.poll() is None and len(at_death) < len(ALL), (
        f"the client had finished reading before {pod} died: nothing was in flight. {reader.read.describe()}"
    )
    return at_death


def _partly_read(elements: list[str]) -> set[str]:
    """The files of which some but not all records were read."""
    per_file = Counter(e.split("-")[0] for e in set(elements))
    return {f for f, n in per_file.items() if n < RECORDS}


def test_deleting_a_worker_mid_epoch_under_dynamic_loses_only_its_splits_and_repeats_none(services: Services) -> None:
    address = services.create("dyn", "DYNAMIC")
    with services.reader(address, "DYNAMIC", "many", "--delay=0.05", "--timeout=200") as reader:
        at_death = _delete_worker_mid_read(services, reader, "dyn-worker-1")
        read = reader.finish(220)
    assert read.returncode == 0, read.describe()
    counts = read.counts()
    assert max(counts.values()) == 1, f"repeated: {[e for e, n in counts.items() if n > 1]}"
    missing = set(ALL) - set(counts)
    # DYNAMIC is at-most-once: the split the worker was reading when it died is lost, and the
    # client had read part of it by then. A worker holds at most that split (a file) and the
    # one it prefetched.
    lost = _files_of(missing)
    assert missing, f"nothing was lost: the worker held no split when it died ({len(at_death)} read by then)"
    assert lost & _partly_read(at_death), f"lost files {lost}, none of them partly read when the worker died"
    assert len(lost) <= 2, f"missing {len(missing)} elements from files {lost}"
    services.delete("dyn")


def test_deleting_a_worker_mid_epoch_under_file_rereads_its_shard(services: Services) -> None:
    address = services.create("fil", "FILE")
    with services.reader(address, "FILE", "many", "--delay=0.05", "--timeout=200") as reader:
        at_death = _delete_worker_mid_read(services, reader, "fil-worker-1")
        read = reader.finish(220)
    assert read.returncode == 0, read.describe()
    counts = read.counts()
    assert set(counts) == set(ALL), f"lost: {sorted(set(ALL) - set(counts))[:20]}"
    # Worker i of n owns files i, i+n, ...: worker 1 had read part of its shard when it died, and
    # its replacement read the shard again from the start, so those elements came twice.
    shard = {f"f{i}" for i in range(1, FILES, 2)}
    assert _partly_read(at_death) & shard, f"no file of worker 1's shard was partly read when it died: {at_death}"
    repeated = {e for e, n in counts.items() if n > 1}
    assert repeated, "nothing was read twice: the replacement worker did not reread its shard"
    assert _files_of(repeated) <= shard, f"repeats outside worker 1's shard {sorted(shard)}: {sorted(repeated)[:20]}"
    services.delete("fil")


def test_static_scale_up_and_down_while_idle(services: Services) -> None:
    address = services.create("grow", "FILE")
    journals = [services.journal("grow")]
    read = services.read(address, "FILE")  # the workers now hold tasks of this journal
    assert read.counts() == Counter(ALL), read.describe()
    services.kubectl.run("scale", "tfdata/grow", "--replicas=3", "-n", services.ns)
    wait_for(
        lambda: services.get("grow")["status"]["workers"]["summary"] == "3/3",
        240,
        "3/3 workers",
        show=lambda: services.describe("grow"),
    )
    services.wait_ready("grow")
    assert len(services.get("grow")["status"]["workerAddresses"]) == 3
    for i in range(3):
        status = services.pod(f"grow-worker-{i}")["status"]["containerStatuses"][0]
        assert status["restartCount"] == 0, f"grow-worker-{i} restarted: {status}"
    read = services.read(address, "FILE")
    assert read.counts() == Counter(ALL), read.describe()
    everywhere = services.read(address, "OFF")
    assert everywhere.counts() == Counter(ALL * 3), "3 workers should each produce the dataset once"
    journals.append(services.journal("grow"))

    services.kubectl.run("scale", "tfdata/grow", "--replicas=2", "-n", services.ns)
    wait_for(
        lambda: len(services.get("grow")["status"].get("workerAddresses") or []) == 2,
        240,
        "the dispatcher's 2-worker list",
        show=lambda: services.describe("grow"),
    )
    services.wait_ready("grow")
    # Back to 2 workers, but never back to the first journal: replaying it would hand out task
    # ids the workers already finished under the second one, and lose their shards.
    journals.append(services.journal("grow"))
    assert len(set(journals)) == 3, journals
    read = services.read(address, "FILE")
    assert read.counts() == Counter(ALL), read.describe()
    services.delete("grow")


def test_clear_errors_instead_of_hangs(services: Services) -> None:
    """FILE sharding over fewer files than workers, and a client whose mode needs a worker list the service lacks."""
    static = services.create("few", "FILE")
    read = services.read(static, "FILE", "one", timeout=90)
    assert read.returncode == 2 and read.error, read.describe()
    assert "worker" in read.error.lower() and "file" in read.error.lower(), read.error
    services.delete("few")

    dynamic = services.create("nolist", "DYNAMIC")
    read = services.read(dynamic, "FILE", timeout=90)
    assert read.returncode == 2 and read.error, read.describe()
    assert "workers list" in read.error, read.error
    services.delete("nolist")


def test_a_running_but_unready_dispatcher_is_explained_by_its_own_readyz(services: Services) -> None:
    """A static dispatcher runs but waits for listed workers that cannot be scheduled: the
    status quotes the server's own /readyz ("0 of 2 workers registered"), and the workers'
    condition the scheduler's reason."""
    body = {
        "apiVersion": API_VERSION,
        "kind": "TFDataService",
        "metadata": {"name": "waits", "namespace": services.ns},
        "spec": {"shardingPolicy": "FILE", "workers": {"replicas": 2, "nodeSelector": {"tfdata.dev/no": "such-node"}}},
    }
    services.kubectl.apply(body)

    def explained() -> dict[str, Any] | None:
        status = services.get("waits").get("status") or {}
        dispatcher, workers = _condition(status, "DispatcherReady"), _condition(status, "WorkersReady")
        # The server says "starting: importing TensorFlow" first, then how many listed workers registered.
        registered = "workers registered" in dispatcher.get("message", "")
        return status if dispatcher.get("reason") == "ServerNotReady" and registered and workers.get("reason") else None

    status = wait_for(explained, 180, "DispatcherReady=False with the server's /readyz", interval=1,
                      show=lambda: services.describe("waits"))  # fmt: skip
    dispatcher, workers = _condition(status, "DispatcherReady"), _condition(status, "WorkersReady")
    assert dispatcher["status"] == "False" and "0 of 2 workers registered" in dispatcher["message"], dispatcher
    assert (workers["status"], workers["reason"]) == ("False", "Unschedulable"), workers
    assert "node affinity/selector" in workers["message"] or "didn't match" in workers["message"], workers
    services.delete("waits")


# --- Held rescales and suspend (rescalePolicy, spec.suspend) -------------------------------


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def _settled(services: Services, name: str, workers: int) -> bool:
    status = services.get(name).get("status") or {}
    return (
        len(status.get("workerAddresses") or []) == workers
        and status.get("workers", {}).get("summary") == f"{workers}/{workers}"
        and _condition(status, "Ready").get("status") == "True"
    )


def _patch(services: Services, name: str, patch: str) -> None:
    services.kubectl.run("patch", "tfdata", name, "-n", services.ns, "--type=merge", "-p", patch)


def _scale(services: Services, name: str, replicas: int) -> float:
    """Scales like a user would; returns when it was asked (monotonic)."""
    asked = time.monotonic()
    services.kubectl.run("scale", f"tfdata/{name}", f"--replicas={replicas}", "-n", services.ns)
    return asked


def test_an_idle_static_rescale_2_to_3_is_timed(services: Services) -> None:
    address = services.create("timed", "FILE")
    read = services.read(address, "FILE")  # a reader came and went: the service is idle again
    assert read.counts() == Counter(ALL), read.describe()
    for replicas in (3, 2):
        asked = _scale(services, "timed", replicas)
        wait_for(lambda n=replicas: _settled(services, "timed", n), 120, f"Ready with {replicas} workers",
                 interval=0.2, show=lambda: services.describe("timed"))  # fmt: skip
        print(f"idle static rescale to {replicas} workers: {time.monotonic() - asked:.1f} s to Ready")
    read = services.read(address, "FILE")
    assert read.counts() == Counter(ALL), read.describe()
    services.delete("timed")


def test_a_rescale_asked_mid_read_waits_for_the_reader_then_is_carried_out(services: Services) -> None:
    address = services.create("held", "FILE")
    with services.reader(address, "FILE", "many", "--delay=0.1", "--timeout=200") as reader:
        reader.wait_elements(20)
        _scale(services, "held", 3)
        status = wait_for(lambda: services.get("held")["status"], 30, "the change to show as held",
                          until=lambda st: (st.get("held") or {}).get("change") == "workers 2→3",
                          show=lambda: services.describe("held"))  # fmt: skip
        workers = _condition(status, "WorkersReady")
        assert workers["reason"] == "RescaleHeld" and "rescalePolicy: Immediate" in workers["message"], status
        assert status["workers"]["desired"] == 3 and status["workers"]["current"] == 2, status
        shown = services.kubectl.run("get", "tfdata", "held", "-n", services.ns).stdout
        assert "workers 2→3" in shown, shown
        assert len(services.get("held")["status"]["workerAddresses"]) == 2, "the dispatcher restarted mid-read"
        read = reader.finish(220)
    ended = time.monotonic()
    assert read.returncode == 0, read.describe()
    assert read.counts() == Counter(ALL), read.describe()  # every element exactly once
    wait_for(lambda: len(services.get("held")["status"].get("workerAddresses") or []) == 3, 30,
             "the held change carried out within 30 s after the reader ended", interval=0.2,
             show=lambda: services.describe("held"))  # fmt: skip
    print(f"held rescale carried out {time.monotonic() - ended:.1f} s after the reader ended")
    wait_for(
        lambda: _settled(services, "held", 3),
        120,
        "Ready with 3 workers",
        show=lambda: services.describe("held"),
    )
    events = services.kubectl.run("get", "events", "-n", services.ns, "--field-selector",
                                  "involvedObject.name=held", "-o", "custom-columns=R:.reason").stdout  # fmt: skip
    assert "RescaleHeld" in events and "HeldChangeCarriedOut" in events, events
    read = services.read(address, "FILE")
    assert read.counts() == Counter(ALL), read.describe()
    services.delete("held")


def test_an_immediate_rescale_breaks_the_reader_as_documented(services: Services) -> None:
    address = services.create("rush", "FILE", workers={"replicas": 2, "rescalePolicy": "Immediate"})
    # A slow reader (all 240 elements take 2 minutes at least), so that the rescale lands mid-read on a
    # loaded machine too: beside the kind tier, a reader at 0.1 s an element once read everything
    # before the dispatcher restarted (2026-11-29). It breaks at the restart, so this costs no time.
    with services.reader(address, "FILE", "many", "--delay=0.5", "--timeout=300") as reader:
        reader.wait_elements(20)
        _scale(services, "rush", 3)
        read = reader.finish(330)
    # docs/concepts.md: the dispatcher restarts with a fresh journal, and the reading job is gone: the
    # client fails with TensorFlow's NotFoundError for its iteration (not a hang, not another error).
    assert read.returncode == 2, read.describe()
    assert read.error is not None and read.error.startswith("NotFoundError: "), read.describe()
    assert "Iteration client id not found" in read.error, read.describe()
    assert len(read.elements) < len(ALL), read.describe()
    print(f"a reader under an Immediate rescale read {len(read.elements)} elements, then: {read.error[:300]}")
    services.delete("rush")


def test_suspend_removes_every_pod_and_resume_serves_at_the_same_address(services: Services) -> None:
    address = services.create("park", "FILE")
    with services.reader(address, "FILE", "many", "--delay=0.05", "--timeout=200") as reader:
        reader.wait_elements(20)
        _patch(services, "park", '{"spec":{"suspend":true}}')
        wait_for(lambda: services.get("park")["status"], 30, "the suspend to show as held",
                 until=lambda st: _condition(st, "Suspended").get("reason") == "SuspendHeld",
                 show=lambda: services.describe("park"))  # fmt: skip
        read = reader.finish(220)
    assert read.returncode == 0 and read.counts() == Counter(ALL), read.describe()

    selector = "app.kubernetes.io/instance=park"
    wait_for(lambda: not services.kubectl.json("get", "pods", "-n", services.ns, "-l", selector)["items"], 60,
             "every pod of the suspended service to go", show=lambda: services.describe("park"))  # fmt: skip
    status = wait_for(lambda: services.get("park")["status"], 30, "Suspended",
                      until=lambda st: _condition(st, "Suspended").get("status") == "True")  # fmt: skip
    assert _condition(status, "Ready")["reason"] == "Suspended" and status["dispatcherAddress"] == address, status
    claims = services.kubectl.json("get", "pvc", "-n", services.ns)["items"]
    assert "journal-park-dispatcher-0" in [c["metadata"]["name"] for c in claims]
    for service in ("park-dispatcher", "park-dispatcher-pods", "park-worker"):
        services.kubectl.run("get", "service", service, "-n", services.ns)

    _patch(services, "park", '{"spec":{"suspend":false}}')
    assert services.wait_ready("park") == address
    read = services.read(address, "FILE")
    assert read.returncode == 0 and read.counts() == Counter(ALL), read.describe()
    services.delete("park")


@dataclass
class Scaled:
    """What a read that the autoscaler scaled for showed."""

    reached: float  # seconds from the client's start to 3 ready workers
    ratio: float  # the client's rate with 3 or more ready workers over its rate with 1


def read_until_three_workers(
    services: Services,
    name: str,
    address: str,
    *extra: str,
    landed: Callable[[], None],
    stop: Path,
    timeout: float,
    repeat: int = 1,
) -> Scaled:
    """Reads the whole dataset (``repeat`` times in one job) again and again, each time as a new job,
    until the autoscaler has 3 workers Ready, then to the end of the read under way and one whole read
    more; checks each read for exactly once, and prints the client's rate at each count. The rate with
    3 or more is that last read's, begun after they were Ready: the read under way while workers came
    can end long after its last element (in CI, 18 s and more, 2026-11-29), and a ratio taken across
    that end measured the scaling, not the workers. ``landed`` asserts, once 3 are Ready, that the
    test's fault really happened."""
    started = time.monotonic()
    args = (*extra, f"--repeat={repeat}", f"--until-file={stop}", "--timeout=600")
    counts = WorkerCounts(services.kubectl, services.ns, name)
    with counts, services.reader(address, "DYNAMIC", "many", *args) as reader:
        wait_for(
            lambda: counts.most_ready() >= 3 or reader.proc.poll() is not None,
            timeout,
            "3 ready workers while the client reads",
            interval=2,
            show=lambda: f"{services.get(name).get('status', {}).get('autoscaling')}\n{reader.read.describe()}",
        )
        assert reader.proc.poll() is None, f"the client ended (seen: {counts.seen}): {reader.read.describe()}"
        reached = time.monotonic() - started
        landed()
        under_way = len(reader.read.ends)
        wait_for(
            lambda: len(reader.read.ends) > under_way or reader.proc.poll() is not None,
            180,
            "the read under way when 3 workers were Ready to end",
            interval=1,
            show=reader.read.describe,
        )
        stop.touch()  # the client ends after the next read, the one measured with 3 or more workers
        read = reader.finish(240)
        phases = counts.phases(read.times)
    assert read.returncode == 0, read.describe()
    assert read.ends and read.ends[-1] == len(read.elements), f"reads ended at {read.ends}: {read.describe()}"
    every = Counter({element: repeat for element in ALL})
    for i, (a, b) in enumerate(itertools.pairwise([0, *read.ends])):
        missing, twice = every - Counter(read.elements[a:b]), Counter(read.elements[a:b]) - every
        assert not missing and not twice, f"read {i + 1} of {len(read.ends)} lost {missing} and repeated {twice}"
    print(
        f"\n{name}: {counts.most_ready()} ready workers {reached:.0f}s after the client started; "
        f"{len(read.ends)} reads of the {len(ALL)} elements x{repeat} in {read.times[-1] - read.times[0]:.0f}s, "
        "each exactly once"
    )
    for ready, seconds, elements in phases:
        print(f"  {ready} ready workers: {seconds:5.1f}s, {elements:5d} elements, {elements / seconds:6.1f} elements/s")
    alone = [(s, e) for ready, s, e in phases if ready == 1]
    assert alone, f"no time read at 1 worker: {phases}"
    assert len(read.ends) >= 2, f"no whole read after 3 workers were Ready: reads ended at {read.ends}"
    last = read.times[read.ends[-2] : read.ends[-1]]
    fewest = counts.fewest_ready(last[0], last[-1])
    assert fewest >= 3, f"the last read, meant to be read with 3 or more workers, saw {fewest} Ready: {counts.seen}"
    many = (len(last) - 1) / (last[-1] - last[0])
    print(f"  the last read, {fewest} or more ready workers: {last[-1] - last[0]:5.1f}s, {many:6.1f} elements/s")
    ratio = many / (sum(e for _, e in alone) / sum(s for s, _ in alone))
    print(f"  throughput with 3 or more workers (the last read) / with 1: {ratio:.2f}")
    return Scaled(reached, ratio)


def test_tfdata_autoscaling_adds_workers_under_load_and_returns_to_one(
    services: Services, kubectl: Kubectl, tmp_path: Path
) -> None:
    """A DYNAMIC service autoscaled as examples/autoscaling.yaml says (TFData, 1..4 workers) under a CPU-heavy
    read: the operator adds workers from the dispatcher's signals alone (no metrics-server) until there are
    at least 3, the client reads faster with them, every element is read exactly once, and once the client
    stops the service goes back to one worker.

    Each worker is limited to a quarter of a core (the dev node enforces CPU limits with a cgroup quota):
    a worker is then saturated at its limit, as in a cluster whose workers have limits, and 4 of them
    still fit on this 2-core machine beside the client and the control plane. Without a limit, one
    worker already took both cores and more could not read faster."""
    name = "auto"
    # examples/autoscaling.yaml's settings as written (1..4 workers, a 60 s window before removing).
    autoscaling = yaml.safe_load((ROOT / "examples" / "autoscaling.yaml").read_text())["spec"]["autoscaling"]
    quarter = {"requests": {"cpu": "250m"}, "limits": {"cpu": "250m"}}
    address = services.create(name, "DYNAMIC", autoscaling=autoscaling, workers={"replicas": 1, "resources": quarter})
    worker = services.pod(f"{name}-worker-0")
    cgroup = nodeagent.Layout(services.state_dir).cpu_cgroup / f"pod{worker['metadata']['uid']}" / "worker"
    assert (cgroup / "cpu.cfs_quota_us").read_text().strip() == "25000", f"the dev node did not limit {cgroup}"

    def throttled() -> None:
        # The fault landed: the first worker was held to its limit while it read alone.
        stat = dict(line.split() for line in (cgroup / "cpu.stat").read_text().splitlines())
        assert int(stat["nr_throttled"]) > 0, f"{cgroup} was never throttled: {stat}"

    started = time.monotonic()
    scaled = read_until_three_workers(
        services, name, address, "--burn=60", landed=throttled, stop=tmp_path / "stop", timeout=360
    )
    # Three workers at their limit give three times one; half of that is a rise no noise makes.
    assert scaled.ratio >= 1.5, "the client read no faster with 3 or more workers"

    status = services.get(name)["status"]["autoscaling"]
    assert status["lastScale"]["toReplicas"] >= 3, status
    events = kubectl.run("describe", "tfdata", name, "-n", services.ns).stdout
    assert "Scaled workers from 1 to" in events, events
    print(events[events.index("Events:") :])
    wait_for(
        lambda: services.get(name)["spec"]["workers"]["replicas"] == 1,
        180,
        "the autoscaler to go back to one worker once the client stopped (the example's window: 60 s)",
        interval=2,
        show=lambda: services.get(name).get("status", {}).get("autoscaling"),
    )
    events = kubectl.run("describe", "tfdata", name, "-n", services.ns).stdout
    assert "to 1: no client has read" in events, events
    print(f"autoscaling: back to 1 worker {time.monotonic() - started:.0f}s after the client started")
    services.delete(name)


def test_tfdata_autoscaling_adds_workers_to_an_io_bound_read_that_gets_faster(
    services: Services, kubectl: Kubectl, tmp_path: Path
) -> None:
    """An I/O-bound pipeline (each element waits 100 ms in the worker, as a read from a bucket does, and
    costs almost no CPU; long enough that the workers, not the client's per-element calls on this loaded
    2-core machine, limit the rate; each job reads the files 3 times, so that starting jobs costs little)
    read by a trainer that reports its data stalls through the client helper's ``iterate()``: the workers
    stay far below the CPU target, the trainer waits on data all the time, and the autoscaler still adds
    workers, keeping each step because the trainer's element rate rose. It reaches at least 3 workers, the
    trainer reads at least 2.5 times as fast as with one, every element exactly once."""
    name = "auto-io"
    autoscaling = yaml.safe_load((ROOT / "examples" / "autoscaling.yaml").read_text())["spec"]["autoscaling"]
    address = services.create(name, "DYNAMIC", autoscaling=autoscaling, workers={"replicas": 1})
    report = kubectl.json("get", "configmap", f"{name}-client", "-n", services.ns)["data"]["TFDATA_REPORT_URL"]

    def stalled_on_idle_workers() -> None:
        # The fault landed: the trainer reported, waiting on data, and the workers were far below their target.
        signals = services.get(name)["status"]["autoscaling"]["signals"]
        assert stalled_on_idle_workers_said(signals, autoscaling["targetCPUUtilizationPercentage"]), signals

    scaled = read_until_three_workers(
        services, name, address, "--sleep-ms=100", f"--report={report}",
        landed=stalled_on_idle_workers, stop=tmp_path / "stop", timeout=420, repeat=3,
    )  # fmt: skip
    assert scaled.ratio >= 2.5, "the client did not read 2.5 times as fast with 3 or more workers"
    events = kubectl.run("describe", "tfdata", name, "-n", services.ns).stdout
    assert "waiting on input, not CPU; trying 2" in events, events
    assert "more workers did not help" not in events, events
    print(events[events.index("Events:") :])
    services.delete(name)


def test_scale_to_zero_and_back_for_a_reader_that_gets_every_element(services: Services, kubectl: Kubectl) -> None:
    """``minReplicas: 0``: with nobody reading, the workers go to zero and the service stays Ready
    (reason ScaledToZero); a trainer that starts then just waits, the operator brings a worker at once
    (the dispatcher's journal names the waiting client), and the trainer reads every element exactly
    once. Prints the time from the trainer's first ``next()`` to its first element."""
    name = "zero"
    autoscaling = {"minReplicas": 0, "maxReplicas": 2, "scaleDownStabilizationWindowSeconds": 20}
    address = services.create(name, "DYNAMIC", replicas=1, autoscaling=autoscaling)
    started = time.monotonic()

    def scaled_to_zero() -> bool:
        svc = services.get(name)
        ready = [c for c in svc.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
        pods = kubectl.json("get", "pods", "-n", services.ns, "-l", f"app.kubernetes.io/instance={name}")["items"]
        workers = [p for p in pods if "-worker-" in p["metadata"]["name"]]
        return (
            svc["spec"]["workers"]["replicas"] == 0
            and not workers
            and bool(ready)
            and ((ready[0]["status"], ready[0]["reason"]) == ("True", "ScaledToZero"))
        )

    wait_for(scaled_to_zero, 180, "the workers to go to zero, the service Ready (ScaledToZero)", interval=2,
             show=lambda: services.describe(name))  # fmt: skip
    print(f"\nscale to zero: no worker {time.monotonic() - started:.0f}s after the service was Ready")
    table = kubectl.run("get", "tfdata", name, "-n", services.ns, "-o", "wide").stdout
    assert "ScaledToZero" in table and "0/0" in table, table
    read = services.read(address, "DYNAMIC", timeout=240)
    assert read.returncode == 0, read.describe()
    assert read.counts() == Counter(ALL), read.describe()
    assert read.iterating is not None and read.times
    waited = read.times[0] - read.iterating
    print(f"scale to zero: the first element {waited:.1f}s after the first next(), from zero workers")
    events = kubectl.run("describe", "tfdata", name, "-n", services.ns).stdout
    assert "Scaled workers from 0 to 1: a client is reading and no worker runs (scaled to zero)" in events, events
    wait_for(lambda: services.get(name)["spec"]["workers"]["replicas"] == 0, 180, "back to zero after the read",
             interval=2, show=lambda: services.get(name).get("status", {}).get("autoscaling"))  # fmt: skip
    services.delete(name)
