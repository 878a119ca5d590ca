"""Checks the Kubernetes core types a TFDataService embeds (affinity, tolerations, ...).

The schemas in ``coretypes.json`` are the ones ``hack/crd-schemas.py`` writes into the CRD
(a unit test fails when the two drift), so ``tfdata-operator render`` refuses what the API
server would refuse at ``kubectl apply``, with the path of the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from functools import cache
from importlib import resources
from typing import Any

from tfdata_operator.api import quantity

AFFINITY = "io.k8s.api.core.v1.Affinity"
TOLERATION = "io.k8s.api.core.v1.Toleration"
RESOURCES = "io.k8s.api.core.v1.ResourceRequirements"
TOPOLOGY_SPREAD = "io.k8s.api.core.v1.TopologySpreadConstraint"
NETWORK_POLICY_PEER = "io.k8s.api.networking.v1.NetworkPolicyPeer"
VOLUME = "io.k8s.api.core.v1.Volume"
VOLUME_MOUNT = "io.k8s.api.core.v1.VolumeMount"
ENV_VAR = "io.k8s.api.core.v1.EnvVar"
ENV_FROM_SOURCE = "io.k8s.api.core.v1.EnvFromSource"

# metav1.Time as the API server writes it (a condition's lastTransitionTime, a taint's timeAdded).
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def parse_time(value: Any) -> datetime | None:
    """A metav1.Time, in UTC; None for a missing or malformed one."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.strptime(value, TIME_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": Mapping,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
}


@cache
def _schemas() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("coretypes.json").read_text()
    schemas: dict[str, Any] = json.loads(text)
    return schemas


def problems(value: Any, definition: str, path: str) -> list[str]:
    """What is wrong with ``value`` as a ``definition`` at ``path``; empty if nothing."""
    return _check(value, _schemas()[definition], path)


def as_stored(value: Any, definition: str) -> Any:
    """A checked ``value`` of ``definition`` with each quantity as the API server stores it (``quantity``)."""
    return _as_stored(value, _schemas()[definition])


def _as_stored(value: Any, schema: Mapping[str, Any]) -> Any:
    if schema.get("x-kubernetes-int-or-string") and "pattern" in schema:  # a quantity (a port has no pattern)
        return quantity.canonical(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else value
    if isinstance(value, list):
        return [_as_stored(item, schema.get("items", {})) for item in value]
    if isinstance(value, Mapping):
        extra, properties = schema.get("additionalProperties"), schema.get("properties", {})
        return {
            k: _as_stored(v, extra if isinstance(extra, Mapping) else properties.get(k, {})) for k, v in value.items()
        }
    return value


def fields(definition: str) -> tuple[str, ...]:
    """The fields of ``definition`` the CRD embeds, sorted."""
    return tuple(sorted(_schemas()[definition].get("properties", {})))


def _check(value: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            return [f"{path} must be an integer or a string, got {describe(value)}"]
        if "pattern" in schema and not re.search(schema["pattern"], str(value)):
            return [f"{path} must be a quantity such as 500m or 1Gi, got {describe(value)}"]
        return []
    kind = schema.get("type")
    if kind is not None and not _is(value, kind):
        return [f"{path} must be {_a(kind)}, got {describe(value)}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path} must be one of {', '.join(schema['enum'])}, got {describe(value)}"]
    if isinstance(value, str) and len(value) > schema.get("maxLength", len(value)):
        return [f"{path} must be at most {schema['maxLength']} characters long, got {len(value)}"]
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            return [f"{path} must have at most {schema['maxItems']} items, got {len(value)}"]
        return [p for i, item in enumerate(value) for p in _check(item, schema.get("items", {}), f"{path}[{i}]")]
    if isinstance(value, Mapping):
        return _check_object(value, schema, path)
    return []


def _check_object(value: Mapping[str, Any], schema: Mapping[str, Any], path: str) -> list[str]:
    if len(value) > schema.get("maxProperties", len(value)):
        return [f"{path} must have at most {schema['maxProperties']} entries, got {len(value)}"]
    found = [f"{path}.{key} is required" for key in schema.get("required", ()) if value.get(key) is None]
    if "additionalProperties" in schema:
        for key, item in value.items():
            found += _check(item, schema["additionalProperties"], f"{path}.{key}")
        return found
    properties = schema.get("properties", {})
    unknown = sorted(str(k) for k in value if k not in properties)
    if unknown:
        found.append(f"{path} has unknown fields: {', '.join(unknown)}")
    for key, item in value.items():
        if key in properties and item is not None:
            found += _check(item, properties[key], f"{path}.{key}")
    return found


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[kind])


def _a(kind: str) -> str:
    return {"object": "an object", "array": "a list", "integer": "an integer"}.get(kind, f"a {kind}")


def describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__
