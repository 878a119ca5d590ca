"""Golden files: every example's manifests, and every refusal's whole sentence, exactly as they are.

The other unit tests say what each field means; these catch what nobody meant to change: a
renamed key, a probe's period, a default, a reworded refusal. After an intended change, `make
golden` rewrites the files (tests/unit/golden/); review their diff like code, and commit it with a
`Golden: <reason>` line (tests/fixtures/golden.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tfdata_operator import cli
from tfdata_operator.api import spec
from tfdata_operator.render.builders import BuildSettings

from fixtures.cases import BAD_SPECS, CRD_PATH, EXAMPLES, IMAGE, body, manifest

# The `golden` fixture (tests/fixtures/golden.py): golden(name, text).
Golden = Callable[[str, str], None]

# The chart's defaults: the operator in tfdata-system, so every NetworkPolicy has its rule.
SETTINGS = BuildSettings(
    operator_namespace="tfdata-system", operator_pod_labels=(("app.kubernetes.io/name", "tfdata-operator"),)
)


def render(doc: dict[str, object]) -> str:
    objects = cli.render_document(doc, "golden", IMAGE, SETTINGS)
    return yaml.safe_dump_all(objects, sort_keys=True, default_flow_style=False, width=120)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_renders_exactly_its_golden_manifests(example: Path, golden: Golden) -> None:
    docs = [d for d in yaml.safe_load_all(example.read_text()) if d is not None]
    golden(f"{example.stem}.yaml", "---\n".join(render(d) for d in docs))


# What no example sets: every optional field at once, on each kind of policy.
EVERYTHING = {
    "image": "registry.example/tfdata-server:1.2",
    "imagePullPolicy": "IfNotPresent",
    "imagePullSecrets": [{"name": "registry"}],
    "preload": {"modules": ["tensorflow_text"], "opLibraries": ["/opt/ops/libmyops.so"]},
    "networkPolicy": {
        "enabled": True,
        "from": [{"podSelector": {"matchLabels": {"team": "vision"}}}],
        "egress": {"enabled": True, "except": ["169.254.169.254/32", "fd00:ec2::254/128", "10.20.0.0/16"]},
    },
    "dispatcher": {
        "port": 6000,
        "healthPort": 8090,
        "faultTolerantMode": True,
        "storage": {"size": "2Gi", "storageClassName": "fast"},
        "jobGcCheckIntervalMs": 30000,
        "jobGcTimeoutMs": 600000,
        "clientTimeoutMs": 20000,
        "workerTimeoutMs": 40000,
        "workerMaxConcurrentSnapshots": 2,
        "resources": {"requests": {"cpu": "300m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}},
        "nodeSelector": {"pool": "cpu"},
        "priorityClassName": "high",
        "serviceAccountName": "dispatcher",
        "labels": {"team": "vision"},
        "annotations": {"note": "golden"},
        # HOME replaces the operator's default for an image of the user's.
        "env": [{"name": "TF_CPP_MIN_LOG_LEVEL", "value": "1"}, {"name": "HOME", "value": "/home/tf"}],
        "tmpSizeLimit": "256Mi",
    },
    "workers": {
        "replicas": 3,
        "port": 6001,
        "healthPort": 8091,
        "heartbeatIntervalMs": 2000,
        "dispatcherTimeoutMs": 30000,
        "dataTransferProtocol": "grpc",
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}},
        "tolerations": [{"key": "data", "operator": "Exists", "effect": "NoSchedule"}],
        "serviceAccountName": "worker",
        "labels": {"team": "vision"},
        "annotations": {"note": "golden"},
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "imagenet", "readOnly": True}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
        "envFrom": [{"configMapRef": {"name": "settings"}}],
        "tmpSizeLimit": "20Gi",
        "crossTrainerCacheSize": "6Gi",
    },
}


@pytest.mark.parametrize("policy", ["OFF", "DYNAMIC", "FILE", "DATA", "FILE_OR_DATA", "HINT"])
def test_every_optional_field_renders_exactly_its_golden_manifests(policy: str, golden: Golden) -> None:
    golden(f"everything-{policy.lower()}.yaml", render(body("everything", "ml", shardingPolicy=policy, **EVERYTHING)))


def test_every_refusal_is_exactly_its_golden_sentence(golden: Golden) -> None:
    lines = []
    for case in BAD_SPECS:
        with pytest.raises(spec.SpecError) as err:
            spec.parse({**yaml.safe_load(manifest(case)), "metadata": {"name": case.name, "namespace": "ml"}}, IMAGE)
        lines.append(f"{case.id}: {err.value}\n")
    golden("refusals.txt", "".join(lines))


# --- Every bounded integer field: the CRD's range is spec.py's, edge by edge --------------------------


def bounded_fields() -> list[tuple[str, str, int, int]]:
    """(group, field, minimum, maximum) of every integer field with a range in the CRD."""
    schema = yaml.safe_load(CRD_PATH.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    groups = schema["properties"]["spec"]["properties"]
    return [
        (group, name, field["minimum"], field["maximum"])
        for group in ("dispatcher", "workers", "autoscaling", "nodeLoss")
        for name, field in groups[group]["properties"].items()
        if field.get("type") == "integer" and "minimum" in field and "maximum" in field
    ]


# Below the CRD's least, values the operator still takes, and why.
TAKEN_BELOW = {
    ("nodeLoss", "replaceAfterSeconds"): "a service stored when the CRD allowed 0 stays valid; it is used as 30",
}
# In-range values another rule refuses whatever they are, and why.
REFUSED_ANYWAY = {
    ("workers", "dataTransferPort"): "TensorFlow 2.21 has only the grpc protocol, which sends over spec.workers.port",
}


def refusal(group: str, name: str, value: int) -> str | None:
    """What spec.py says of a spec that sets only this field (None: accepted)."""
    # Autoscaling needs DYNAMIC (and room for minReplicas up to 1000); a rescale wait, a static policy.
    fields: dict[str, Any] = {"shardingPolicy": "DYNAMIC", "autoscaling": {"maxReplicas": 1000}}
    if (group, name) == ("workers", "rescaleMaxWaitSeconds"):
        fields = {"shardingPolicy": "FILE"}
    if (group, name) == ("workers", "replicas"):  # 0 only for a service that scales to zero
        fields["autoscaling"]["minReplicas"] = 0
    fields.setdefault(group, {})[name] = value
    try:
        spec.parse(body("ranges", "ml", **fields), IMAGE)
    except spec.SpecError as err:
        return str(err)
    return None


def test_every_bounded_field_takes_its_edges_and_refuses_one_past_them(golden: Golden) -> None:
    """The API server (the CRD's minimum and maximum) and the operator (spec.py, also for `render`)
    refuse the same numbers; each refusal's sentence is in golden/ranges.txt."""
    fields = bounded_fields()
    assert len(fields) >= 19, fields
    lines = []
    for group, name, low, high in fields:
        if (group, name) not in REFUSED_ANYWAY:
            for value in (low, high):
                assert refusal(group, name, value) is None, (
                    f"spec.{group}.{name}={value}: {refusal(group, name, value)}"
                )
        if (group, name) in TAKEN_BELOW:
            assert refusal(group, name, low - 1) is None and refusal(group, name, 0) is None
            lines.append(f"spec.{group}.{name}={low - 1}: accepted, {TAKEN_BELOW[group, name]}\n")
            lines.append(f"spec.{group}.{name}=-1: {refusal(group, name, -1)}\n")
        for value in (low - 1, high + 1):
            if value == low - 1 and (group, name) in TAKEN_BELOW:
                continue
            said = refusal(group, name, value)
            assert said is not None, f"spec.{group}.{name}={value} was accepted; the CRD allows {low}..{high}"
            lines.append(f"spec.{group}.{name}={value}: {said}\n")
    # Inside its range but not a timeout TensorFlow takes:
    lines.append(f"spec.dispatcher.jobGcTimeoutMs=0: {refusal('dispatcher', 'jobGcTimeoutMs', 0)}\n")
    golden("ranges.txt", "".join(lines))
