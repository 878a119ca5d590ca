"""One snapshot directory, one TFDataService, on a real API server with the operator as a process.

Two services name one `spec.snapshots.directory` (written differently: a trailing slash). The one
created later is refused from the operator's cache: `Ready` False, reason `SnapshotDirectoryTaken`,
a message naming the first and the directory, one Warning Event, and no child while it lasts. Once
the first is deleted, the second is queued at once and created as any service.
"""

from __future__ import annotations

from typing import Any

from fixtures.manifests import service_manifest
from fixtures.support import Kubectl, OperatorProcess, holds_for, wait_for

# Longer than one resync (OperatorProcess sets TFDATA_RESYNC_SECONDS=5): the refusal is sampled
# through at least one reconcile of the second service.
HOLD_SECONDS = 6.0
DIRECTORY = "gs://shared-bucket/team/snapshots"
CHILD_KINDS = "services,configmaps,statefulsets,poddisruptionbudgets,networkpolicies"
REASON = "SnapshotDirectoryTaken"


def service(namespace: str, name: str, directory: str) -> dict[str, Any]:
    return service_manifest(
        name,
        {"shardingPolicy": "DYNAMIC", "workers": {"replicas": 1}, "snapshots": {"directory": directory}},
        namespace,
    )


def ready(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    found = kubectl.get("tfdata", name, "-n", namespace) or {}
    return next((c for c in (found.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), {})


def children(kubectl: Kubectl, namespace: str, name: str) -> list[str]:
    listed = kubectl.json("get", CHILD_KINDS, "-n", namespace, "-l", f"app.kubernetes.io/instance={name}")
    return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in listed["items"])


def warnings(kubectl: Kubectl, namespace: str, name: str) -> list[str]:
    selector = f"involvedObject.kind=TFDataService,involvedObject.name={name},reason={REASON}"
    listed = kubectl.json("get", "events", "-n", namespace, "--field-selector", selector)["items"]
    return [f"{e['type']} x{e.get('count') or 1}: {e['message']}" for e in listed]


def test_the_later_service_on_one_snapshot_directory_is_refused_until_the_first_is_deleted(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    kubectl.apply(service(namespace, "alpha", DIRECTORY))
    wait_for(lambda: children(kubectl, namespace, "alpha"), 60, "alpha's children")
    first_children = children(kubectl, namespace, "alpha")
    # Created later; in the same second (creationTimestamp counts seconds) the first name, alpha, goes first too.
    kubectl.apply(service(namespace, "beta", DIRECTORY + "/"))

    refused = wait_for(
        lambda: ready(kubectl, namespace, "beta"),
        30,
        f"beta's Ready condition with reason {REASON}",
        until=lambda c: c.get("reason") == REASON,
    )
    assert refused["status"] == "False"
    assert refused["message"].startswith(
        f"spec.snapshots.directory {DIRECTORY}/ is the same as TFDataService alpha's snapshot directory {DIRECTORY} "
    ), refused["message"]
    assert "It proceeds by itself once alpha is deleted" in refused["message"]
    holds_for(
        lambda: (children(kubectl, namespace, "beta"), ready(kubectl, namespace, "beta").get("reason")),
        HOLD_SECONDS,
        "beta refused with no child",
        ok=lambda seen: seen == ([], REASON),
    )
    assert children(kubectl, namespace, "alpha") == first_children, "the first service is left as it is"
    events = wait_for(lambda: warnings(kubectl, namespace, "beta"), 10, f"a Warning Event {REASON} on beta")
    assert len(events) == 1 and events[0].startswith("Warning x1: spec.snapshots.directory"), events

    # The first goes: the second is queued (its deletion's event does it;
    # tests/unit/plan/test_snapshotdir.py pins that).
    kubectl.run("delete", "tfdata", "alpha", "-n", namespace, "--wait=true", "--timeout=30s", timeout=40)
    wait_for(
        lambda: children(kubectl, namespace, "beta"),
        30,
        "beta's children once alpha is gone",
        show=lambda: (ready(kubectl, namespace, "beta"), operator.tail(20)),
    )
    wait_for(
        lambda: ready(kubectl, namespace, "beta"),
        30,
        "beta's Ready condition without the refusal",
        until=lambda c: bool(c) and c.get("reason") != REASON,
    )
    assert len(warnings(kubectl, namespace, "beta")) == 1, "the refusal was told once"


def test_the_operator_logged_no_errors(operator: OperatorProcess) -> None:
    log = operator.log()
    assert "Traceback" not in log, operator.tail(80)
    assert not operator.errors(), "\n".join(operator.errors())
