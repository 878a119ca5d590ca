"""The pure part of a reconcile: what a TFDataService's children should be, given what they are.

No I/O and no Kubernetes client: ``render`` and the unit tests call it directly, and the
reconcile loop (``controller/apply.py``) feeds it what the watches observed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfdata_operator.api import diff, reasons, spec
from tfdata_operator.plan import drain, scaling
from tfdata_operator.plan.children import render_all
from tfdata_operator.render import builders
from tfdata_operator.render.builders import BuildSettings, Counts

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Children:
    """What exists now: the children by (kind, name), and every pod of the service."""

    name: str
    objects: Mapping[tuple[str, str], Manifest] = field(default_factory=dict)
    pods: list[Manifest] = field(default_factory=list)
    # Objects with a child's name that this TFDataService does not own: never touched.
    foreign: list[tuple[str, str]] = field(default_factory=list)

    def get(self, kind: str, name: str) -> Manifest | None:
        return self.objects.get((kind, name))

    @property
    def dispatcher(self) -> Manifest | None:
        return self.get("StatefulSet", builders.dispatcher_name(self.name))

    @property
    def workers(self) -> Manifest | None:
        return self.get("StatefulSet", builders.workers_name(self.name))

    def pods_of(self, component: str) -> list[Manifest]:
        return [p for p in self.pods if p["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component]

    def pod_names(self, component: str) -> list[str]:
        return [p["metadata"]["name"] for p in self.pods_of(component)]


@dataclass(frozen=True)
class Desired:
    """The children this reconcile should converge to, in the order they are applied."""

    apply: list[Manifest]
    delete: list[tuple[str, str, str]]  # api version, kind, name
    waiting: str | None


def desired_children(
    svc: spec.ServiceSpec,
    settings: BuildSettings,
    children: Children,
    server: Mapping[str, Any] | None = None,
    max_unavailable: int = 1,
) -> Desired:
    """The pure part of a reconcile: what the children should be now, given what they are.

    The counts are decided first (``decide_counts``), then every child kind's objects are
    rendered once, in the order of ``children.CHILDREN``. ``server`` is what the servers reported
    (status.server), which the client ConfigMap publishes; ``max_unavailable`` is the workers'
    disruption budget (``plan.drain``).
    """
    counts, waiting = decide_counts(svc, settings, children)
    counts = dataclasses.replace(counts, server=server, max_unavailable=max_unavailable)
    apply: list[Manifest] = []
    delete: list[tuple[str, str, str]] = []
    for kind, (name, manifest) in render_all(svc, settings, counts):
        if manifest is not None:
            apply.append(manifest)
        elif "delete" in kind.verbs and (live := children.get(kind.kind, name)) and owned_by(live, svc.uid):
            delete.append((kind.api_version, kind.kind, name))
    return Desired(apply=apply, delete=delete, waiting=waiting)


def decide_counts(svc: spec.ServiceSpec, settings: BuildSettings, children: Children) -> tuple[Counts, str | None]:
    """This step of a worker-count change (``scaling.plan``), and why it waits if it does."""
    live_config = builders.read_config(children.dispatcher)
    step = scaling.step(
        svc,
        children.workers,
        children.dispatcher,
        children.pods_of(builders.DISPATCHER),
        scaling.live_worker_list(live_config),
        lambda n: builders.worker_addresses(svc, settings, n),
        scaling.highest_ordinal_plus_one(children.pod_names(builders.WORKER), builders.workers_name(svc)),
    )
    journal = builders.static_journal(svc, settings, step.dispatcher_workers, live_config)
    counts = Counts(step.dispatcher_workers, 0 if svc.suspend else step.worker_replicas, journal)
    return counts, step.waiting


def needs_apply(desired: Any, live: Any) -> bool:
    """Whether ``live`` lacks any part of ``desired`` (fields the server adds are ignored)."""
    return diff.changes(live, desired, apply=True)


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences") or [])


def key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def change_events(
    desired: Manifest, live: Manifest | None, drains: drain.DrainDecision | None = None
) -> tuple[str, str]:
    """The Event (reason, message) for applying ``desired`` over ``live``: what a user would want to read.
    ``drains`` says why the workers' disruption budget is what it is."""
    kind, name = key(desired)
    if live is None:
        return reasons.CREATED, f"Created {kind} {name}"
    if kind == "PodDisruptionBudget" and drains is not None:
        before, after = (live.get("spec") or {}).get("maxUnavailable"), desired["spec"].get("maxUnavailable")
        if before != after:
            return drain.event(drains, name)
    if kind == "StatefulSet":
        before, after = (live.get("spec") or {}).get("replicas"), desired["spec"].get("replicas")
        scaled = f"from {before} to {after} replicas"
        if needs_apply(desired["spec"].get("template"), (live.get("spec") or {}).get("template")):
            message = f"Rolling out a new pod template to StatefulSet {name} ({_why_rolled(desired, live)})"
            return reasons.ROLLING_OUT, message + (f", and scaling it {scaled}" if before != after else "")
        if before != after:
            return reasons.SCALED, f"Scaled StatefulSet {name} {scaled}"
    return reasons.UPDATED, f"Updated {kind} {name} ({_differing(desired, live)})"


def _why_rolled(desired: Manifest, live: Manifest) -> str:
    """What a pod template change is for: a static dispatcher's new worker list, else the fields."""
    old = scaling.live_worker_list(builders.read_config(live))
    new = scaling.live_worker_list(builders.read_config(desired))
    if old is not None and new is not None and len(old) != len(new):
        return (
            f"its worker list changes from {len(old)} to {len(new)} workers; the dispatcher restarts "
            "because it reads the list only when it starts"
        )
    return _differing(desired, live)


def _differing(desired: Manifest, live: Manifest) -> str:
    """The paths (two levels deep) where ``live`` lacks what ``desired`` sets, for a message."""
    paths = []
    for top, value in desired.items():
        if not needs_apply(value, live.get(top)):
            continue
        if isinstance(value, dict) and isinstance(live.get(top), dict):
            paths += [f"{top}.{k}" for k, v in value.items() if needs_apply(v, live[top].get(k))]
        else:
            paths.append(top)
    return ", ".join(paths) or "no field"
