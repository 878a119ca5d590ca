"""What happens to the service and its pods over time: ``spec.lifecycle`` and ``spec.nodeLoss``.

``spec.lifecycle``: the workload the service feeds, and when the service suspends or deletes
itself (after that workload finishes, or when idle). ``spec.nodeLoss``: when a pod on a node that
stopped answering is replaced.
"""

from __future__ import annotations

from tfdata_operator.api.spec.reader import API_VERSION, DNS_SUBDOMAIN, KIND, PRINTABLE_LINE, Reader
from tfdata_operator.api.spec.types import (
    LIFECYCLE_ACTIONS,
    MAX_FENCED_BY_LENGTH,
    MAX_LIFECYCLE_SECONDS,
    MAX_REPLACE_AFTER_SECONDS,
    MIN_REPLACE_AFTER_SECONDS,
    NODE_LOSS_DISPATCHER,
    AfterWorkloadFinishes,
    IdleSpec,
    LifecycleSpec,
    NodeLossSpec,
    WorkloadRef,
)


def parse_lifecycle(r: Reader) -> LifecycleSpec:
    workload = None
    if r.has("workload"):
        w = r.child("workload")
        api_version = w.string("apiVersion", max_length=253, pattern=API_VERSION)
        kind = w.string("kind", max_length=63, pattern=KIND)
        name = w.string("name", max_length=253, pattern=DNS_SUBDOMAIN)
        w.finish()
        for key, value in (("apiVersion", api_version), ("kind", kind), ("name", name)):
            if value is None and not w.has(key):
                r.problems.append(f"{w.path}.{key} is required")
        if api_version and kind and name:
            workload = WorkloadRef(api_version, kind, name)
    after = None
    if r.has("afterWorkloadFinishes"):
        a, d = r.child("afterWorkloadFinishes"), AfterWorkloadFinishes()
        action = a.enum("action", LIFECYCLE_ACTIONS, d.action) or d.action
        seconds = a.integer("afterSeconds", d.after_seconds, 0, MAX_LIFECYCLE_SECONDS)
        a.finish()
        after = AfterWorkloadFinishes(action, d.after_seconds if seconds is None else seconds)
    with_workload = r.boolean("deleteWithWorkload", False)
    idle = None
    if r.has("idle"):
        i = r.child("idle")
        seconds = i.integer("suspendAfterSeconds", None, 1, MAX_LIFECYCLE_SECONDS)
        if not i.has("suspendAfterSeconds"):
            r.problems.append(f"{i.path}.suspendAfterSeconds is required: how long without a reader before suspending")
        i.finish()
        idle = IdleSpec(seconds) if seconds is not None else None
    r.finish()
    if not r.has("workload"):
        for key, given in (("afterWorkloadFinishes", after is not None), ("deleteWithWorkload", with_workload)):
            if given:
                r.problems.append(
                    f"{r.path}.{key} needs {r.path}.workload: name the Job (or other workload) it follows"
                )
    return LifecycleSpec(workload, after, with_workload, idle)


def parse_node_loss(r: Reader) -> NodeLossSpec:
    d = NodeLossSpec()
    # 0 and up: a service stored when the CRD's least was 0 stays valid (the CRD's least is now
    # MIN_REPLACE_AFTER_SECONDS; its validation ratcheting keeps an unchanged value); it is used as 30.
    after = r.integer("replaceAfterSeconds", d.replace_after_seconds, 0, MAX_REPLACE_AFTER_SECONDS)
    dispatcher_after = r.integer(
        "dispatcherReplaceAfterSeconds",
        d.dispatcher_replace_after_seconds,
        MIN_REPLACE_AFTER_SECONDS,
        MAX_REPLACE_AFTER_SECONDS,
    )
    dispatcher = r.enum("dispatcher", NODE_LOSS_DISPATCHER, d.dispatcher)
    fenced_by = r.string("fencedBy", None, max_length=MAX_FENCED_BY_LENGTH, pattern=PRINTABLE_LINE)
    r.finish()
    assert after is not None and dispatcher_after is not None and dispatcher is not None
    return NodeLossSpec(
        replace_after_seconds=after,
        dispatcher_replace_after_seconds=dispatcher_after,
        dispatcher=dispatcher,
        fenced_by=fenced_by,
    )
