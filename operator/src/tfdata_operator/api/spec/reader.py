"""Reading one object of the spec: typed fields, each problem with its path, and the patterns they match.

``Reader`` is how every section (``spec/*.py``) reads its part: a wrong field is a problem
appended to the one list ``parse`` raises with, and the field's default is used meanwhile, so that
one run names every problem. The patterns several sections share live here, with the words a
refusal uses for each (``PATTERN_NAMES``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tfdata_operator.api.coretypes import describe

QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# Names of other objects (PriorityClass, ServiceAccount, StorageClass, Secret).
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# One line of printable text (spec.nodeLoss.fencedBy: quoted in the status and Events).
PRINTABLE_LINE = re.compile(r"^[^\x00-\x1f\x7f]+$")
# A workload's apiVersion (group/version, or v1) and kind, as Kubernetes spells them.
API_VERSION = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?v[0-9]+((alpha|beta)[0-9]+)?$"
)
KIND = re.compile(r"^[A-Z][A-Za-z0-9]*$")
# What a refusal says a value must be, for the patterns a person cannot be expected to read.
PATTERN_NAMES = {
    DNS_SUBDOMAIN: "a Kubernetes object name (lowercase letters, digits, '-' and '.')",
    PRINTABLE_LINE: "one line of text, without control characters",
    API_VERSION: "an apiVersion such as batch/v1 or jobset.x-k8s.io/v1alpha2",
    KIND: "a kind as Kubernetes spells it, a capital letter first (Job, JobSet)",
}


class Reader:
    """Reads typed fields from one object of the spec, collecting problems with their paths."""

    def __init__(self, data: Any, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            problems.append(f"{path} must be an object, got {describe(data)}")
            data = {}
        self.data: Mapping[str, Any] = data
        self.seen: set[str] = set()

    def _get(self, key: str) -> Any:
        self.seen.add(key)
        return self.data.get(key)

    def fail(self, key: str, message: str) -> None:
        """A problem with the field ``key`` of this object."""
        self.problems.append(f"{self.path}.{key} {message}")

    def has(self, key: str) -> bool:
        """Whether ``key`` is set: null is unset, as the API server has it (a known field either way)."""
        self.seen.add(key)
        return self.data.get(key) is not None

    def integer(self, key: str, default: int | None, lo: int, hi: int) -> int | None:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"must be an integer, got {describe(value)}")
            return default
        if not lo <= value <= hi:
            self.fail(key, f"must be between {lo} and {hi}, got {value}")
            return default
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {describe(value)}")
            return default
        return value

    def string(
        self, key: str, default: str | None = None, max_length: int = 253, pattern: re.Pattern[str] | None = None
    ) -> str | None:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            self.fail(key, f"must be a string, got {describe(value)}")
            return default
        if not value or len(value) > max_length:
            self.fail(key, f"must be 1 to {max_length} characters long, got {len(value)}")
            return default
        if pattern is not None and not pattern.match(value):
            what = PATTERN_NAMES.get(pattern)
            must = f"it must be {what}" if what else f"it must match {pattern.pattern}"
            self.fail(key, f"has an invalid value {value!r}: {must}")
            return default
        return value

    def enum(self, key: str, choices: tuple[str, ...], default: str | None) -> str | None:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool):
            hint = ' (YAML turns a bare OFF, ON, yes or no into a boolean: write "OFF" in quotes)'
            self.fail(key, f"must be one of {_choices(choices)}, got the boolean {str(value).lower()}{hint}")
            return default
        if value not in choices:
            self.fail(key, f"must be one of {_choices(choices)}, got {value!r}")
            return default
        assert isinstance(value, str)
        return value

    def quantity(self, key: str, default: str) -> str:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, str)) or not QUANTITY.match(str(value)):
            self.fail(key, f"must be a quantity such as 1Gi or 500m, got {describe(value)}")
            return default
        return str(value)

    def string_map(self, key: str, max_items: int, max_value: int) -> dict[str, str]:
        value = self._get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(key, f"must be a map of strings, got {describe(value)}")
            return {}
        if len(value) > max_items:
            self.fail(key, f"must have at most {max_items} entries, got {len(value)}")
        bad = sorted(str(k) for k, v in value.items() if not isinstance(v, str) or len(v) > max_value)
        if bad:
            self.fail(key, f"values must be strings of at most {max_value} characters (check {', '.join(bad)})")
            return {}
        return {str(k): v for k, v in value.items()}

    def child(self, key: str) -> Reader:
        return Reader(self._get(key), f"{self.path}.{key}", self.problems)

    def raw(self, key: str) -> Any:
        return self._get(key)

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            self.problems.append(f"{self.path} has unknown fields: {', '.join(unknown)}")


def _choices(choices: tuple[str, ...]) -> str:
    return ", ".join(f'"{c}"' if c == "OFF" else c for c in choices)
