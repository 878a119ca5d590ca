"""``parse``, the one way into the typed spec: a TFDataService object in, a ``ServiceSpec`` out.

The CRD's schema and CEL rules reject most bad input at ``kubectl apply`` time; the spec is read
again here field by field (``tfdata-operator render`` sees files the API server never saw), each
section by its module (``spec/dispatcher.py``, ``spec/workers.py``, ...), then checked across
sections (``spec/checks.py``) for what the schema cannot express. Defaults equal the CRD's (a unit
test compares them). This module reads the top-level fields itself: the image and how it is
pulled, the server program and what it preloads, suspend.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tfdata_operator.api import kueue
from tfdata_operator.api.spec import checks
from tfdata_operator.api.spec.autoscaling import parse_autoscaling
from tfdata_operator.api.spec.dispatcher import parse_dispatcher
from tfdata_operator.api.spec.lifecycle import parse_lifecycle, parse_node_loss
from tfdata_operator.api.spec.network import parse_network_policy
from tfdata_operator.api.spec.pods import node_volumes
from tfdata_operator.api.spec.reader import DNS_SUBDOMAIN, Reader
from tfdata_operator.api.spec.snapshots import parse_snapshots
from tfdata_operator.api.spec.types import (
    MAX_PRELOADS,
    SERVER_PROGRAM_AUTO,
    SERVER_PROGRAM_FROM_IMAGE,
    SERVER_PROGRAM_INJECTED,
    SERVER_PROGRAMS,
    KueueSpec,
    PreloadSpec,
    ServiceSpec,
    SpecError,
)
from tfdata_operator.api.spec.workers import parse_workers
from tfdata_operator.wire import serverconfig
from tfdata_operator.wire.sharding import SHARDING_POLICIES

_ABSOLUTE_PATH = re.compile(r"/[^\0]*")


def parse(body: Mapping[str, Any], default_image: str | None, *, allow_host_path: bool = False) -> ServiceSpec:
    """Turns a TFDataService object into a ServiceSpec, or raises SpecError listing every problem.

    ``allow_host_path``: the operator's --allow-host-path-volumes (hostPath volumes refused without it)."""
    problems: list[str] = []
    metadata = body.get("metadata") or {}
    name = str(metadata.get("name") or "")
    problems += checks.name(name)
    if body.get("spec") is None:
        problems.append("spec is required")
    service = _read(Reader(body.get("spec"), "spec", problems), metadata, name, default_image)
    service = replace(service, kueue=_kueue(metadata.get("labels"), problems))
    if not allow_host_path:
        problems += node_volumes("spec.dispatcher", service.dispatcher.pod)
        problems += node_volumes("spec.workers", service.workers.pod)
    problems += checks.across_sections(service)
    if problems:
        raise SpecError(problems)
    return service


def _read(spec: Reader, metadata: Mapping[str, Any], name: str, default_image: str | None) -> ServiceSpec:
    """Every section of ``spec``, in the order its problems are listed; an unset image is left empty
    (``checks.across_sections`` refuses it)."""
    policy = spec.enum("shardingPolicy", SHARDING_POLICIES, "OFF")
    image = spec.string("image", default_image, max_length=512)
    server_program = spec.enum("serverProgram", SERVER_PROGRAMS, SERVER_PROGRAM_AUTO)
    preload = _preload(spec.child("preload"))
    pull_policy = spec.enum("imagePullPolicy", ("Always", "IfNotPresent", "Never"), None)
    pull_secrets = _pull_secrets(spec.raw("imagePullSecrets"), spec.problems)
    suspend = spec.boolean("suspend", False)
    # The injected program's volume is reserved unless the image brings the program (types.PROGRAM_VOLUME).
    program = server_program != SERVER_PROGRAM_FROM_IMAGE
    snapshots = parse_snapshots(spec.child("snapshots"), program) if spec.has("snapshots") else None
    dispatcher = parse_dispatcher(spec.child("dispatcher"), snapshots, program)
    workers = parse_workers(spec.child("workers"), snapshots, program)
    autoscaling = parse_autoscaling(spec.child("autoscaling")) if spec.has("autoscaling") else None
    network_policy = parse_network_policy(spec.child("networkPolicy"))
    node_loss = parse_node_loss(spec.child("nodeLoss"))
    lifecycle = parse_lifecycle(spec.child("lifecycle"))
    spec.finish()
    assert policy is not None  # enum() falls back to its default, "OFF"
    return ServiceSpec(
        name=name,
        namespace=str(metadata.get("namespace") or "default"),
        uid=str(metadata.get("uid") or ""),
        image=image or "",
        generation=_generation(metadata.get("generation")),
        sharding_policy=policy,
        image_pull_policy=pull_policy,
        image_pull_secrets=pull_secrets,
        dispatcher=dispatcher,
        workers=workers,
        autoscaling=autoscaling,
        network_policy=network_policy,
        node_loss=node_loss,
        lifecycle=lifecycle,
        snapshots=snapshots,
        suspend=suspend,
        inject_server=server_program == SERVER_PROGRAM_INJECTED
        or (server_program == SERVER_PROGRAM_AUTO and image != default_image),
        preload=preload,
    )


# A LocalQueue's name, as Kueue's Workload takes it in spec.queueName (a DNS label), and a
# WorkloadPriorityClass's (a DNS subdomain; a label value holds at most 63 characters of it).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _kueue(labels: Any, problems: list[str]) -> KueueSpec | None:
    """The Kueue labels of the service (metadata.labels): its LocalQueue and priority class."""
    labels = labels if isinstance(labels, Mapping) else {}
    queue, priority = labels.get(kueue.QUEUE_LABEL), labels.get(kueue.PRIORITY_LABEL)
    found = []
    for key, value, pattern in (
        (kueue.QUEUE_LABEL, queue, _DNS_LABEL),
        (kueue.PRIORITY_LABEL, priority, DNS_SUBDOMAIN),
    ):
        if value is not None and (not isinstance(value, str) or len(value) > 63 or not pattern.fullmatch(value)):
            found.append(
                f"metadata.labels[{key}] must name a Kueue object (lowercase letters, digits and '-', "
                f"at most 63 characters), got {value!r}"
            )
    if priority is not None and queue is None:
        found.append(
            f"metadata.labels[{kueue.PRIORITY_LABEL}] needs {kueue.QUEUE_LABEL}: a priority class applies "
            "to a service admitted through a Kueue LocalQueue; set both, or neither"
        )
    problems.extend(found)
    if found or queue is None:
        return None
    return KueueSpec(queue=queue, priority_class=priority)


def _preload(r: Reader) -> PreloadSpec:
    modules = _string_list(r, "modules", 128, serverconfig.MODULE_NAME, "a Python module name such as tensorflow_text")
    libraries = _string_list(r, "opLibraries", 1024, _ABSOLUTE_PATH, "an absolute path to a shared library (.so)")
    r.finish()
    return PreloadSpec(modules=modules, op_libraries=libraries)


def _string_list(r: Reader, key: str, max_length: int, pattern: re.Pattern[str], what: str) -> tuple[str, ...]:
    value = r.raw(key)
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_PRELOADS:
        r.problems.append(f"{r.path}.{key} must be a list of at most {MAX_PRELOADS} strings")
        return ()
    items = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or len(item) > max_length or not pattern.fullmatch(item):
            r.problems.append(f"{r.path}.{key}[{i}] must be {what} of at most {max_length} characters, got {item!r}")
            continue
        items.append(item)
    if len(set(items)) != len(items):
        r.problems.append(f"{r.path}.{key} lists an entry twice: {sorted(i for i in set(items) if items.count(i) > 1)}")
    return tuple(items)


def _generation(value: Any) -> int:
    """metadata.generation as the API server sets it; 0 for a manifest that was never stored."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _pull_secrets(value: Any, problems: list[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > 16:
        problems.append("spec.imagePullSecrets must be a list of at most 16 {name: ...} entries")
        return ()
    names = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str) or not item["name"]:
            problems.append(f"spec.imagePullSecrets[{i}] must be an object with a non-empty name")
            continue
        if len(item["name"]) > 253 or not DNS_SUBDOMAIN.match(item["name"]):
            problems.append(f"spec.imagePullSecrets[{i}].name {item['name']!r} is not a valid Secret name")
            continue
        names.append(item["name"])
    return tuple(names)
