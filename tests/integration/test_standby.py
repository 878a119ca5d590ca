"""Two operator processes on one Lease: one reconciles, the other stands by and takes over.

Both run as real processes against the real control plane, watching the module's namespace
and electing on a Lease there, with short durations (flags a user can set too) so that the
tests are quick. A standby is proven idle by its own counters: it sent no request and ran no
reconcile while the other led (counters only grow: one reading at the end covers the whole
time); the leader is then gone (SIGKILL) or has exited, so the two never wrote at once.
"""

from __future__ import annotations

import json
import re
import secrets
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tfdata_operator.controller import faults
from tfdata_operator.plan import children

from fixtures.cases import expected_children
from fixtures.manifests import API_VERSION
from fixtures.support import Kubectl, OperatorProcess, Watch, wait_for

CHILD_KINDS = ",".join(kind.plural for kind in children.CHILDREN)
# What a user could set too; the takeover after a SIGKILL takes about the lease duration.
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 4, 3.0, 1.0


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "TFDataService",
        "metadata": {"name": name},
        "spec": {"shardingPolicy": "DYNAMIC", "workers": {"replicas": 2}},
    }


class Namespace:
    def __init__(self, kubectl: Kubectl, name: str) -> None:
        self.kubectl, self.name = kubectl, name

    def apply(self, name: str) -> None:
        self.kubectl.run("apply", "-n", self.name, "-f", "-", input=json.dumps(service(name)))

    def children(self, instance: str) -> list[dict[str, Any]]:
        items = self.kubectl.json("get", CHILD_KINDS, "-n", self.name, "-l", f"app.kubernetes.io/instance={instance}")
        return list(items["items"])

    def names(self, instance: str) -> set[tuple[str, str]]:
        return {(o["kind"], o["metadata"]["name"]) for o in self.children(instance)}

    def lease(self, name: str) -> dict[str, Any]:
        lease = self.kubectl.get("lease", name, "-n", self.name)
        return (lease or {}).get("spec") or {}

    def reconciled(self, name: str) -> bool:
        """Its status is current and it has exactly its children."""
        obj = self.kubectl.get("tfdataservice", name, "-n", self.name) or {}
        status = obj.get("status") or {}
        current = status.get("observedGeneration") == obj["metadata"]["generation"] and status.get("conditions")
        return bool(current) and self.names(name) == expected_children(service(name))


@pytest.fixture
def ns(kubectl: Kubectl, namespace: str, crd: None) -> Namespace:
    return Namespace(kubectl, namespace)


@pytest.fixture
def candidates(kube_env: dict[str, str], namespace: str, tmp_path: Path) -> Iterator[tuple[str, list[OperatorProcess]]]:
    """A Lease name of its own, and a way to start operators electing on it; all stopped afterwards."""
    lease = f"standby-{secrets.token_hex(3)}"
    started: list[OperatorProcess] = []
    yield lease, started
    for process in started:
        process.stop(signal.SIGKILL)


def candidate(kube_env: dict[str, str], namespace: str, lease: str, log: Path) -> OperatorProcess:
    return OperatorProcess(
        kube_env,
        log,
        f"--namespace={namespace}",
        "--leader-election",
        f"--leader-election-namespace={namespace}",
        f"--leader-election-lease={lease}",
        f"--lease-duration={LEASE_DURATION}",
        f"--renew-deadline={RENEW_DEADLINE}",
        f"--retry-period={RETRY_PERIOD}",
    )


def leads(process: OperatorProcess) -> bool:
    return process.metrics().get("tfdata_operator_leader") == 1


def micro_time(text: str) -> datetime:
    """A Lease's MicroTime ("2006-01-02T15:04:05.000000Z")."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f%z")


def identity(process: OperatorProcess) -> str:
    found = re.search(r"Leader election on the Lease \S+ as (\S+) ", process.log())
    assert found, process.tail()
    return found.group(1)


def idle(process: OperatorProcess) -> dict[str, float]:
    """What a standby must show: it does not lead, ran no reconcile and sent no request."""
    return {
        "leader": process.metrics().get("tfdata_operator_leader", -1),
        "reconciles": process.total("tfdata_operator_reconciles_total"),
        "requests": process.total("tfdata_operator_api_requests_total"),
    }


STANDING_BY = {"leader": 0, "reconciles": 0, "requests": 0}


def standby_of(process: OperatorProcess, leader: OperatorProcess) -> None:
    held_by = f"is held by {identity(leader)}"
    wait_for(lambda: held_by in process.log(), 30, "the second operator to stand by", show=process.tail)
    assert idle(process) == STANDING_BY, process.tail()


def test_the_standby_takes_over_from_a_leader_killed_mid_reconcile(
    ns: Namespace, kube_env: dict[str, str], candidates: tuple[str, list[OperatorProcess]], tmp_path: Path
) -> None:
    lease, started = candidates
    # The first leads; it is armed to hang right after the first apply of a reconcile.
    first = candidate(kube_env, ns.name, lease, tmp_path / "first.log")
    started.append(first.start(**{faults.ENV: "after-first-apply", faults.ACTION_ENV: "hang"}))
    wait_for(lambda: leads(first), 30, "the first operator to lead", show=first.tail)
    second = candidate(kube_env, ns.name, lease, tmp_path / "second.log")
    started.append(second.start())
    standby_of(second, first)

    # Mid-reconcile: each service has its first child, and its reconcile hangs there.
    early, late = [f"early-{i}-{secrets.token_hex(2)}" for i in (1, 2)], f"after-kill-{secrets.token_hex(2)}"
    for name in early:
        ns.apply(name)
    wait_for(
        lambda: first.log().count("Fault point after-first-apply reached") == 2,
        60,
        "both reconciles to reach the fault point",
        show=first.tail,
    )
    partial = {name: ns.children(name) for name in early}
    assert all(len(objects) == 1 for objects in partial.values()), partial
    # Counters only grow: this one reading covers the standby's whole life so far.
    assert idle(second) == STANDING_BY, second.tail()
    assert leads(first)

    assert first.proc is not None
    killed = time.monotonic()
    first.proc.send_signal(signal.SIGKILL)
    ns.apply(late)
    first.proc.wait(10)
    wait_for(lambda: leads(second), 4 * LEASE_DURATION, "the standby to lead", interval=0.1, show=second.tail)
    took_over = time.monotonic() - killed
    wait_for(
        lambda: ns.reconciled(late),
        60,
        "the service applied after the kill to be reconciled",
        interval=0.2,
        show=lambda: (ns.names(late), second.tail()),
    )
    reconciled = time.monotonic() - killed
    print(
        f"\nfailover after SIGKILL (lease {LEASE_DURATION} s, renew deadline {RENEW_DEADLINE} s, "
        f"retry {RETRY_PERIOD} s): the standby led after {took_over:.1f} s and had reconciled "
        f"a service applied after the kill {reconciled:.1f} s after it"
    )

    # Nothing duplicated or orphaned: every service ends with exactly its children, each owned by
    # it once, and the children the killed leader made were adopted, not made again.
    for name in (*early, late):
        wait_for(lambda n=name: ns.reconciled(n), 60, f"{name} to be reconciled", show=lambda n=name: ns.names(n))
        uid = ns.kubectl.json("get", "tfdataservice", name, "-n", ns.name)["metadata"]["uid"]
        objects = ns.children(name)
        names = [(o["kind"], o["metadata"]["name"]) for o in objects]
        assert len(names) == len(set(names)), names
        for obj in objects:
            assert [r["uid"] for r in obj["metadata"]["ownerReferences"]] == [uid], obj["metadata"]
    for name, objects in partial.items():
        uids = {(o["kind"], o["metadata"]["name"]): o["metadata"]["uid"] for o in ns.children(name)}
        for obj in objects:
            assert uids[obj["kind"], obj["metadata"]["name"]] == obj["metadata"]["uid"], f"{name}: recreated"
    # The standby finished them: its own counters show a reconcile of each that wrote.
    for name in (*early, late):
        assert second.reconciles(ns.name, name).get("changed", 0) >= 1, (name, second.reconciles(ns.name, name))

    spec = ns.lease(lease)
    assert spec["holderIdentity"] == identity(second) and spec["leaseTransitions"] == 1, spec
    assert "Leading: took the Lease" in second.log()
    second.finish()  # exits 0 on SIGTERM, no traceback
    assert ns.lease(lease)["holderIdentity"] == "", "a clean exit hands the Lease back"


def test_a_leader_that_exits_cleanly_hands_over_at_once(
    ns: Namespace, kube_env: dict[str, str], candidates: tuple[str, list[OperatorProcess]], tmp_path: Path
) -> None:
    """A rolling update or a drain: SIGTERM, the leader releases the Lease, the standby need not wait it out."""
    lease, started = candidates
    first = candidate(kube_env, ns.name, lease, tmp_path / "first.log")
    started.append(first.start())
    wait_for(lambda: leads(first), 30, "the first operator to lead", show=first.tail)
    second = candidate(kube_env, ns.name, lease, tmp_path / "second.log")
    started.append(second.start())
    standby_of(second, first)
    ns.apply("handover")
    wait_for(lambda: ns.reconciled("handover"), 60, "the leader to reconcile", show=lambda: ns.names("handover"))
    assert idle(second) == STANDING_BY, second.tail()

    leader, standby = identity(first), identity(second)
    versions = Watch(ns.kubectl, "lease", lease, "-n", ns.name)
    try:
        wait_for(lambda: versions.events, 20, "the watch to list the Lease")
        stopped = time.monotonic()
        first.finish()  # SIGTERM: exits 0, no traceback
        exited = time.monotonic() - stopped
        wait_for(lambda: leads(second), 2 * LEASE_DURATION, "the standby to lead", interval=0.1, show=second.tail)
        took_over = time.monotonic() - stopped - exited
        wait_for(
            lambda: [v for v in versions.events if v["spec"].get("holderIdentity") == standby],
            10,
            "the watch to show the standby's Lease",
            show=lambda: [v["spec"] for v in versions.events],
        )
    finally:
        versions.stop()
    print(f"\nhandover on SIGTERM: the leader exited in {exited:.1f} s, the standby led {took_over:.1f} s later")
    assert "Released the Lease" in first.log()
    # The Lease's own history, on this host's one clock: the leader's last renewal, its release
    # (no holder), the standby's take. Taken by expiry instead, the take would come a whole lease
    # duration after the last renewal the standby saw, at the earliest.
    specs = [v["spec"] for v in versions.events]
    holders = [spec.get("holderIdentity") or "" for spec in specs]
    assert leader in holders and standby in holders, specs
    last_renewal = specs[len(holders) - 1 - holders[::-1].index(leader)]
    taken = specs[holders.index(standby)]
    assert "" in holders[holders.index(leader) : holders.index(standby)], f"never released: {specs}"
    gap = (micro_time(taken["acquireTime"]) - micro_time(last_renewal["renewTime"])).total_seconds()
    print(f"the standby took the Lease {gap:.1f} s after the leader's last renewal")
    assert gap < LEASE_DURATION, f"taken {gap:.1f} s after the last renewal: by expiry, not by the release: {specs}"

    ns.kubectl.run("annotate", "tfdata/handover", "-n", ns.name, "example.com/after=handover")
    # The new leader reconciles the service itself: its own counters, not the first's.
    results = wait_for(
        lambda: second.reconciles(ns.name, "handover"), 30, "the new leader to reconcile handover", show=second.tail
    )
    assert "error" not in results, (results, second.tail())
    second.finish()


def test_one_operator_without_an_election_reconciles_from_the_start(operator: OperatorProcess) -> None:
    """With one replica (no --leader-election, the chart's default), nothing waits and no Lease exists."""
    assert leads(operator)
    assert "Leader election" not in operator.log()
