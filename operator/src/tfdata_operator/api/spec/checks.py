"""The checks across sections of the spec, which no single section can make alone.

The service's name, since every child's name derives from it; an image to run; autoscaling
against the sharding policy, the workers' CPU request and the dispatcher's journal; the journal
against the snapshot directory; workers scaled to zero. ``parse`` runs them after reading every
section, so that one refusal lists every problem.
"""

from __future__ import annotations

import re

from tfdata_operator.api import paths
from tfdata_operator.api.spec.types import (
    AUTOSCALING_POLICIES,
    CPU_METRIC,
    MAX_NAME_LENGTH,
    ServiceSpec,
)

# Service names are DNS-1035 labels (a letter first), and the Services are named after the service.
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def name(value: str) -> list[str]:
    """The refusal of metadata.name, if any: the names of the children derive from it."""
    if not value:
        return ["metadata.name is required"]
    if len(value) > MAX_NAME_LENGTH or not _NAME.match(value):
        return [
            f"metadata.name must be at most {MAX_NAME_LENGTH} characters of lowercase letters, digits "
            f"and '-', starting with a letter (the names of the Services, StatefulSets and pods derive "
            f"from it), got {value!r}"
        ]
    return []


def across_sections(service: ServiceSpec) -> list[str]:
    """Every problem of ``service`` that involves more than one section, in the order a refusal lists them."""
    problems = []
    if not service.image:
        problems.append(
            "spec.image is not set and the operator has no default server image: "
            "set spec.image, or start the operator with --server-image"
        )
    problems += _autoscaling(service)
    problems += _journal_and_snapshots(service)
    workers, autoscaling = service.workers, service.autoscaling
    if workers.replicas == 0 and (autoscaling is None or autoscaling.min_replicas > 0):
        problems.append(
            "spec.workers.replicas 0 is allowed only with spec.autoscaling.minReplicas 0 (scale to zero): "
            "set 1 or more, or set spec.suspend: true to stop every pod"
        )
    return problems


def _autoscaling(service: ServiceSpec) -> list[str]:
    """spec.autoscaling against the sharding policy, the workers' CPU request and the dispatcher's journal."""
    autoscaling, dispatcher, policy = service.autoscaling, service.dispatcher, service.sharding_policy
    if autoscaling is None:
        return []
    problems = []
    if policy not in AUTOSCALING_POLICIES:
        problems.append(
            f'spec.autoscaling is allowed only with shardingPolicy DYNAMIC or "OFF", not {policy}: '
            "the static policies need a fixed list of workers"
        )
    if autoscaling.metric == CPU_METRIC and "cpu" not in service.workers.pod.resources.get("requests", {}):
        problems.append(
            "spec.autoscaling.metric CPU scales on CPU utilization, which needs a CPU request: "
            "set spec.workers.resources.requests.cpu, or use metric TFData (the default), which needs none"
        )
    if autoscaling.min_replicas == 0 and not dispatcher.fault_tolerant_mode:
        problems.append(
            "spec.autoscaling.minReplicas 0 (scale to zero) needs spec.dispatcher.faultTolerantMode true: with "
            "no worker running, the dispatcher's journal is how the operator sees a client waiting. Set "
            "faultTolerantMode to true (its default), or minReplicas to 1 or more"
        )
    if autoscaling.min_replicas == 0 and dispatcher.work_dir is not None and "://" in dispatcher.work_dir:
        problems.append(
            "spec.autoscaling.minReplicas 0 (scale to zero) needs the dispatcher's journal on its pod's own file "
            "system: with no worker running, a client waiting is seen in the journal, which is read there, not "
            "through a URL. Remove spec.dispatcher.workDir (the journal volume), set it to a path, or set "
            "minReplicas to 1 or more"
        )
    return problems


def _journal_and_snapshots(service: ServiceSpec) -> list[str]:
    """spec.snapshots against the dispatcher's journal: apart from it, and only with one."""
    dispatcher, snapshots = service.dispatcher, service.snapshots
    if snapshots is None:
        return []
    problems = []
    journal = dispatcher.journal_base
    where = paths.relation(journal, snapshots.directory) if journal is not None else None
    if dispatcher.fault_tolerant_mode and where in ("the same as", "inside"):
        named = "spec.dispatcher.workDir" if dispatcher.work_dir else "its default"
        problems.append(
            f"the dispatcher's journal ({journal}, {named}) "
            f"is {where} spec.snapshots.directory {snapshots.directory}, where trainers read and delete snapshots: "
            "a DELETE of a snapshot there could remove the journal. Set spec.dispatcher.workDir (or "
            "spec.snapshots.directory) so that neither lies inside the other"
        )
    if not dispatcher.fault_tolerant_mode:
        problems.append(
            "spec.snapshots needs spec.dispatcher.faultTolerantMode true: TensorFlow refuses a snapshot "
            "(distributed_save) on a dispatcher without a journal. Set faultTolerantMode to true (its default), "
            "or remove spec.snapshots"
        )
    return problems
