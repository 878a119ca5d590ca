"""`tfdata-operator render`, the CRD's shape, and keeping TensorFlow out of the operator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tfdata_operator import cli
from tfdata_operator.api import spec
from tfdata_operator.plan import desired as plan
from tfdata_operator.render.builders import BuildSettings

from fixtures.cases import BAD_SPECS, CRD_PATH, EXAMPLES, HOST_PATH, BadSpec, manifest


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_render_prints_what_the_builders_build(path: Path) -> None:
    result = CliRunner().invoke(cli.main, ["render", "-f", str(path)])
    assert result.exit_code == 0, result.output
    rendered = list(yaml.safe_load_all(result.output))
    doc = yaml.safe_load(path.read_text())
    doc["metadata"].update(namespace="default", uid=cli.RENDER_UID)
    svc = spec.parse(doc, cli.DEFAULT_SERVER_IMAGE)
    expected = plan.desired_children(svc, BuildSettings(), plan.Children(svc.name))
    assert rendered == expected.apply
    assert {o["kind"] for o in rendered} >= {"Service", "StatefulSet"}


def test_examples_cover_every_policy_and_autoscaling() -> None:
    docs = [yaml.safe_load(p.read_text()) for p in EXAMPLES]
    assert {d["spec"]["shardingPolicy"] for d in docs} == set(spec.SHARDING_POLICIES)
    metrics = {d["spec"]["autoscaling"].get("metric") for d in docs if "autoscaling" in d["spec"]}
    assert metrics == set(spec.AUTOSCALING_METRICS)


@pytest.mark.parametrize("case", BAD_SPECS[:6], ids=lambda c: c.id)
def test_render_refuses_bad_files_like_the_operator(case: Any, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(manifest(case))
    result = CliRunner().invoke(cli.main, ["render", "-f", str(path)])
    assert result.exit_code == 1
    assert case.operator_says in result.output


@pytest.mark.parametrize(
    ("args", "env", "allowed"),
    [
        ([], {}, False),
        ([], {"TFDATA_ALLOW_HOST_PATH_VOLUMES": "false"}, False),  # what the chart sets by default
        ([spec.ALLOW_HOST_PATH_FLAG], {}, True),
        ([], {"TFDATA_ALLOW_HOST_PATH_VOLUMES": "true"}, True),
    ],
)
def test_render_takes_a_host_path_only_as_an_operator_allowed_to_does(
    args: list[str], env: dict[str, str], allowed: bool, tmp_path: Path
) -> None:
    path = tmp_path / "host-path.yaml"
    path.write_text(manifest(BadSpec("host-path", HOST_PATH, "", "")))
    result = CliRunner().invoke(cli.main, ["render", "-f", str(path), *args], env=env)
    if not allowed:
        assert result.exit_code == 1 and "is a hostPath volume, which this operator refuses" in result.output
        return
    assert result.exit_code == 0, result.output
    (workers,) = [
        o
        for o in yaml.safe_load_all(result.output)
        if o["metadata"]["name"] == "bad-worker" and o["kind"] == "StatefulSet"
    ]
    assert {"name": "home", "hostPath": {"path": "/home"}} in workers["spec"]["template"]["spec"]["volumes"]


def test_render_refuses_other_kinds_and_broken_yaml(tmp_path: Path) -> None:
    other = tmp_path / "cm.yaml"
    other.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    result = CliRunner().invoke(cli.main, ["render", "-f", str(other)])
    assert result.exit_code == 1 and "found v1/ConfigMap" in result.output
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    result = CliRunner().invoke(cli.main, ["render", "-f", str(broken)])
    assert result.exit_code == 1 and "not valid YAML" in result.output


def test_importing_the_operator_does_not_import_tensorflow() -> None:
    code = (
        "import sys\n"
        "import tfdata_operator.cli, tfdata_operator.controller.handlers, tfdata_operator.controller.reconcile\n"
        "import tfdata_operator.server.main\n"
        "from click.testing import CliRunner\n"
        "result = CliRunner().invoke(tfdata_operator.cli.main, ['render', '-f', sys.argv[1]])\n"
        "assert result.exit_code == 0, (result.output, result.exception)\n"
        "assert 'kind: StatefulSet' in result.output, result.output\n"
        "assert 'tensorflow' not in sys.modules, 'the operator imported TensorFlow'\n"
    )
    subprocess.run([sys.executable, "-c", code, str(EXAMPLES[0])], check=True)


def _walk(schema: dict[str, Any], path: str) -> list[str]:
    problems = []
    if path.count(".") > 1 and not path.endswith("[]") and "description" not in schema:
        problems.append(f"{path}: no description")
    if schema.get("type") == "string" and "enum" not in schema and "maxLength" not in schema:
        problems.append(f"{path}: unbounded string")
    if schema.get("type") == "array" and "maxItems" not in schema:
        problems.append(f"{path}: unbounded list")
    if schema.get("type") == "object" and "additionalProperties" in schema and "maxProperties" not in schema:
        problems.append(f"{path}: unbounded map")
    for key, prop in (schema.get("properties") or {}).items():
        problems += _walk(prop, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        problems += _walk(schema["items"], f"{path}[]")
    return problems


def test_crd_is_documented_and_bounded() -> None:
    crd = yaml.safe_load(CRD_PATH.read_text())
    version = crd["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    assert _walk(root["properties"]["spec"], ".spec") == []
    assert _walk(root["properties"]["status"], ".status") == []
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.workers.replicas",
        "statusReplicasPath": ".status.workers.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert crd["spec"]["names"]["shortNames"] == ["tfdata"]
    assert root["properties"]["spec"]["properties"]["shardingPolicy"]["default"] == "OFF"


def test_operator_pod_labels_option_parses_pairs() -> None:
    parsed = cli.parse_pod_labels("app.kubernetes.io/name=tfdata-operator, app.kubernetes.io/instance=ops")
    assert parsed == (("app.kubernetes.io/instance", "ops"), ("app.kubernetes.io/name", "tfdata-operator"))
    assert cli.parse_pod_labels("") == ()


@pytest.mark.parametrize("text", ["team", "team=a b", "-bad=x", "a=b,c"])
def test_run_refuses_bad_operator_pod_labels_naming_them(text: str) -> None:
    result = CliRunner().invoke(cli.main, ["run", f"--operator-pod-labels={text}"])
    assert result.exit_code == 2, result.output
    assert "--operator-pod-labels" in result.output and "key=value" in result.output, result.output


@pytest.mark.parametrize("value", ["-1", "604801", "an hour"])
def test_run_refuses_a_drain_bound_it_cannot_keep(value: str) -> None:
    result = CliRunner().invoke(cli.main, ["run", f"--drain-max-wait-seconds={value}"])
    assert result.exit_code == 2
    assert "Invalid value for '--drain-max-wait-seconds'" in result.output, result.output
