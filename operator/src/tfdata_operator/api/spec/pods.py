"""The parts of a server pod a user sets: ``spec.dispatcher`` and ``spec.workers`` alike.

Resources, tmpSizeLimit, labels and annotations, placement (nodeSelector, tolerations, affinity,
topology spread), priority class, service account, volumes and their mounts, env and envFrom: read
into a ``PodSettings``, each core type checked against Kubernetes' own schema (``coretypes``), and
refused where it would collide with what the operator puts into the pod itself.

``default_requests`` fills in the requests a user left out, when render builds a server container:
a render concern, left here while render/builders.py is split, so that it moves once, into the
module that builds that container.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from tfdata_operator.api import coretypes, kueue
from tfdata_operator.api.coretypes import describe
from tfdata_operator.api.quantity import canonical as canonical_quantity
from tfdata_operator.api.quantity import parse_quantity
from tfdata_operator.api.spec.reader import DNS_SUBDOMAIN, QUANTITY, Reader
from tfdata_operator.api.spec.types import (
    ALLOW_HOST_PATH_FLAG,
    DEFAULT_REQUESTS,
    DEFAULT_TMP_SIZE_LIMIT,
    EPHEMERAL_STORAGE,
    MAX_ENV,
    MAX_ENV_FROM,
    MAX_MOUNTS,
    MAX_TMP_SIZE_LIMIT,
    MAX_VOLUMES,
    MIN_TMP_SIZE_LIMIT,
    NODE_VOLUME_SOURCES,
    PROGRAM_VOLUME,
    RESERVED_ENV,
    RESERVED_LABELS,
    PodSettings,
)

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def pod_settings(r: Reader, own_volumes: Mapping[str, str], component: str) -> PodSettings:
    resources = _resources(r.child("resources"))
    tmp_size_limit = _tmp_size_limit(r, DEFAULT_TMP_SIZE_LIMIT[component])
    labels = _labels(r, "labels", 64)
    reserved = sorted(RESERVED_LABELS & set(labels))
    if reserved:
        r.problems.append(
            f"{r.path}.labels must not set {', '.join(reserved)}: the operator uses them to select its pods"
        )
    if queued := sorted(k for k in labels if k.startswith(kueue.PREFIX)):
        r.problems.append(
            f"{r.path}.labels must not set {', '.join(queued)}: on the service's StatefulSets and pods Kueue "
            f"would queue and freeze them one by one; label the TFDataService itself ({kueue.QUEUE_LABEL}) "
            "to have it admitted through Kueue as one workload (docs/training-runs.md)"
        )
    tolerations = _core_list(r, "tolerations", coretypes.TOLERATION, 32)
    volumes = _volumes(r, own_volumes)
    mounts = _volume_mounts(r, volumes, own_volumes)
    spread = _core_list(r, "topologySpreadConstraints", coretypes.TOPOLOGY_SPREAD, 8)
    affinity = r.raw("affinity")
    found = [] if affinity is None else coretypes.problems(affinity, coretypes.AFFINITY, f"{r.path}.affinity")
    r.problems.extend(found)
    if found:
        affinity = None
    return PodSettings(
        resources=resources,
        node_selector=_labels(r, "nodeSelector", 32),
        tolerations=tolerations or (),
        affinity=affinity,
        topology_spread_constraints=spread,
        priority_class_name=r.string("priorityClassName", pattern=DNS_SUBDOMAIN),
        service_account_name=r.string("serviceAccountName", pattern=DNS_SUBDOMAIN),
        labels=labels,
        annotations=r.string_map("annotations", 64, 4096),
        volumes=volumes or (),
        volume_mounts=mounts,
        env=_env(r),
        env_from=_core_list(r, "envFrom", coretypes.ENV_FROM_SOURCE, MAX_ENV_FROM) or (),
        tmp_size_limit=tmp_size_limit,
    )


def _tmp_size_limit(r: Reader, default: str) -> str:
    value = r.quantity("tmpSizeLimit", default)
    if not QUANTITY.match(value):
        return default  # refused by quantity() already
    low, high = parse_quantity(MIN_TMP_SIZE_LIMIT), parse_quantity(MAX_TMP_SIZE_LIMIT)
    if not low <= parse_quantity(value) <= high:
        r.problems.append(
            f"{r.path}.tmpSizeLimit must be between {MIN_TMP_SIZE_LIMIT} and {MAX_TMP_SIZE_LIMIT}, got {value}: "
            "it bounds the pod's /tmp, and the pod requests that much of its node's disk"
        )
        return default
    return canonical_quantity(value)


def node_volumes(path: str, pod: PodSettings) -> list[str]:
    """The refusal of each volume that reaches the node itself (NODE_VOLUME_SOURCES)."""
    return [
        f"{path}.volumes[{i}] ({volume['name']}) is a hostPath volume, which this operator refuses: it mounts a "
        "directory of the node itself, and the pods run as uid 1000 (on many nodes a user who may sudo), so whoever "
        "can create a TFDataService would control the node. Use a persistentVolumeClaim (a local PersistentVolume "
        f"for data on a node), or have the operator started with {ALLOW_HOST_PATH_FLAG} (the Helm chart's "
        "allowHostPathVolumes: true)"
        for i, volume in enumerate(pod.volumes)
        if any(volume.get(source) is not None for source in NODE_VOLUME_SOURCES)
    ]


def _volumes(r: Reader, own: Mapping[str, str]) -> tuple[Mapping[str, Any], ...] | None:
    """spec.<component>.volumes; None when unset or wrong (so no mount is blamed for it)."""
    volumes = _core_list(r, "volumes", coretypes.VOLUME, MAX_VOLUMES)
    if volumes is None:
        return None
    sources = [f for f in coretypes.fields(coretypes.VOLUME) if f != "name"]
    problems = []
    for i, volume in enumerate(volumes):
        name = volume["name"]
        if len(name) > 63 or not _DNS_LABEL.match(name):
            problems.append(
                f"{r.path}.volumes[{i}].name {name!r} must be at most 63 lowercase letters, digits and '-', "
                "starting and ending with a letter or digit (a DNS label)"
            )
        given = [f for f in sources if volume.get(f) is not None]
        if len(given) != 1:
            problems.append(
                f"{r.path}.volumes[{i}] must set exactly one source of {', '.join(sources)}, "
                f"got {', '.join(given) or 'none'}"
            )
    problems += _duplicates(r, "volumes", "name", volumes)
    for name in sorted(own.keys() & {v["name"] for v in volumes}):
        problems.append(
            f"{r.path}.volumes must not use the name {name}: the operator adds its own {name} volume "
            f"(mounted at {own[name]}). Rename the volume, and its volumeMounts"
        )
    r.problems.extend(problems)
    return None if problems else volumes


def _volume_mounts(
    r: Reader, volumes: tuple[Mapping[str, Any], ...] | None, own: Mapping[str, str]
) -> tuple[Mapping[str, Any], ...]:
    mounts = _core_list(r, "volumeMounts", coretypes.VOLUME_MOUNT, MAX_MOUNTS)
    if mounts is None:
        return ()
    problems = _duplicates(r, "volumeMounts", "mountPath", mounts)
    owners = {path: name for name, path in own.items()}
    for i, mount in enumerate(mounts):
        where, path = f"{r.path}.volumeMounts[{i}]", mount["mountPath"]
        if not path.startswith("/"):
            problems.append(f"{where}.mountPath must be an absolute path (starting with /), got {path!r}")
        if mount.get("recursiveReadOnly") is not None and not mount.get("readOnly"):
            problems.append(f"{where}.recursiveReadOnly needs readOnly: true (Kubernetes refuses it otherwise)")
        if (path.rstrip("/") or "/") in owners:
            problems.append(
                f"{where}.mountPath must not be {path}: the operator mounts its own "
                f"{owners[path.rstrip('/')]} volume there. Mount at another path, e.g. /data"
            )
        elif PROGRAM_VOLUME in own and path.startswith(own[PROGRAM_VOLUME] + "/"):
            problems.append(
                f"{where}.mountPath must not be under {own[PROGRAM_VOLUME]} ({path}): the operator mounts the "
                f"injected server program's {PROGRAM_VOLUME} volume there (spec.serverProgram Injected, or Auto). "
                "Mount at another path, e.g. /data, or set spec.serverProgram: FromImage if the image has tfdata-server"
            )
        if r.has("volumes") and volumes is None:
            continue  # the volumes are wrong already: each mount's name cannot be checked
        if mount["name"] not in {v["name"] for v in volumes or ()}:
            problems.append(
                f"{where}.name {mount['name']!r} names no volume of {r.path}.volumes (the operator's own "
                "volumes cannot be mounted again). Declare the volume, or fix the name"
            )
    r.problems.extend(problems)
    return () if problems else mounts


def _env(r: Reader) -> tuple[Mapping[str, Any], ...]:
    env = _core_list(r, "env", coretypes.ENV_VAR, MAX_ENV)
    if env is None:
        return ()
    problems = _duplicates(r, "env", "name", env)
    reserved = sorted({e["name"] for e in env} & set(RESERVED_ENV))
    if reserved:
        problems.append(
            f"{r.path}.env must not set {', '.join(reserved)}: the operator sets {', '.join(RESERVED_ENV)} "
            "(the server's configuration, the pod's name and namespace) and the server needs its own values. "
            "Rename the variable"
        )
    r.problems.extend(problems)
    return () if problems else env


def _duplicates(r: Reader, key: str, field_name: str, items: tuple[Mapping[str, Any], ...]) -> list[str]:
    """Kubernetes keys these lists by ``field_name``: a value given twice is refused (or overridden)."""
    counts = Counter(str(item[field_name]) for item in items)
    twice = sorted(v for v, n in counts.items() if n > 1)
    return [f"{r.path}.{key} has more than one item with {field_name} {v!r}" for v in twice]


def _core_list(r: Reader, key: str, definition: str, max_items: int) -> tuple[Mapping[str, Any], ...] | None:
    """A list of one Kubernetes core type, checked against Kubernetes' own schema."""
    value = r.raw(key)
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > max_items:
        r.problems.append(f"{r.path}.{key} must be a list of at most {max_items} items")
        return None
    found = [p for i, item in enumerate(value) for p in coretypes.problems(item, definition, f"{r.path}.{key}[{i}]")]
    r.problems.extend(found)
    return None if found else tuple(coretypes.as_stored(item, definition) for item in value)


def _labels(r: Reader, key: str, max_items: int) -> dict[str, str]:
    """A map of Kubernetes labels: qualified names to values of at most 63 characters."""
    labels = r.string_map(key, max_items, 63)
    bad_keys, bad_values = invalid_labels(labels)
    if bad_keys:
        r.problems.append(
            f"{r.path}.{key} has invalid label keys: {', '.join(bad_keys)} (a key is an optional DNS prefix "
            "and '/', then up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
        )
    if bad_values:
        r.problems.append(
            f"{r.path}.{key} has invalid values for {', '.join(bad_values)} (a label value is up to 63 letters, "
            "digits, '-', '_' or '.', starting and ending with a letter or digit)"
        )
    return {} if bad_keys or bad_values else labels


def invalid_labels(labels: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """The keys that are not label keys, and the keys whose values are not label values."""
    bad_keys = sorted(k for k in labels if len(k) > 317 or len(k.rsplit("/", 1)[-1]) > 63 or not _LABEL_KEY.match(k))
    bad_values = sorted(k for k, v in labels.items() if not _LABEL_VALUE.match(v))
    return bad_keys, bad_values


def default_requests(pod: PodSettings, component: str) -> dict[str, dict[str, str]]:
    """The container's resources: the user's, plus a default request for each of CPU, memory and
    ephemeral storage the user left without both request and limit (Kubernetes copies a lone limit
    into the request). The ephemeral storage is the pod's /tmp: as much as tmpSizeLimit lets it hold."""
    resources = {kind: dict(values) for kind, values in pod.resources.items()}
    requests = resources.setdefault("requests", {})
    defaults = {**DEFAULT_REQUESTS[component], EPHEMERAL_STORAGE: pod.tmp_size_limit}
    for resource, amount in defaults.items():
        if resource not in requests and resource not in resources.get("limits", {}):
            requests[resource] = amount
    return resources


def _resources(r: Reader) -> dict[str, dict[str, str]]:
    result: dict[str, dict[str, str]] = {}
    for kind in ("requests", "limits"):
        values = r.raw(kind)
        if values is None:
            continue
        if not isinstance(values, Mapping):
            r.problems.append(f"{r.path}.{kind} must be a map such as {{cpu: 500m, memory: 1Gi}}")
            continue
        parsed: dict[str, str] = {}
        for resource, amount in values.items():
            if isinstance(amount, bool) or not isinstance(amount, (int, str)) or not QUANTITY.match(str(amount)):
                r.problems.append(
                    f"{r.path}.{kind}.{resource} must be a quantity such as 500m or 1Gi, got {describe(amount)}"
                )
                continue
            parsed[str(resource)] = str(amount)
        result[kind] = parsed
    r.finish()
    for resource, request in result.get("requests", {}).items():
        limit = result.get("limits", {}).get(resource)
        if limit is not None and parse_quantity(request) > parse_quantity(limit):
            r.problems.append(
                f"{r.path}.requests.{resource} ({request}) exceeds {r.path}.limits.{resource} ({limit}): "
                "a request must not be larger than its limit"
            )
    return {
        kind: {resource: canonical_quantity(amount) for resource, amount in values.items()}
        for kind, values in result.items()
    }


def same_ports(r: Reader, port: int | None) -> str:
    """The refusal of a pod's port that is its health port, naming a default the user did not write."""
    default = next((f", the default {key}" for key in ("port", "healthPort") if not r.has(key)), "")
    return f"{r.path}.port and {r.path}.healthPort must differ (both are {port}{default})"
