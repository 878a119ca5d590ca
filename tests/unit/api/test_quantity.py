"""Quantities as the API server stores them, and every quantity the operator writes in that form."""

from __future__ import annotations

import pytest
from kubernetes.utils.quantity import parse_quantity

from tfdata_operator.api import quantity, spec
from tfdata_operator.render import builders
from tfdata_operator.render.builders import BuildSettings

from fixtures.cases import parse

# What `kubectl get -o yaml` shows for each as written: apimachinery's TestQuantityParseEmit and the
# alternates of its TestQuantityString (pkg/api/resource/quantity_test.go), then what users write.
STORED = [
    ("1024Mi", "1Gi"),
    ("1000M", "1G"),
    (".001Ki", "1024m"),
    (".000001Ki", "1024u"),
    (".000000001Ki", "1024n"),
    ("307200Ki", "300Mi"),
    ("1025024Mi", "1001Gi"),
    ("1024Gi", "1Ti"),
    ("5000m", "5"),
    ("0.5", "500m"),
    ("0.001T", "1G"),
    ("1000u", "1m"),
    ("1.08", "1080m"),
    ("1080000000n", "1080m"),
    (".001e12", "1e9"),
    ("0.001e0", "1e-3"),
    ("1000e-12", "1e-9"),
    ("00", "0"),
    ("1000m", "1"),
    ("2000m", "2"),
    ("1.5", "1500m"),
    ("0.5Gi", "512Mi"),
    ("1.5Gi", "1536Mi"),
    ("2048Mi", "2Gi"),
    ("2000M", "2G"),
    ("4096Mi", "4Gi"),
    ("0.5Ki", "512"),
    ("0.1Gi", "107374182400m"),
    ("1.5k", "1500"),
    ("1000k", "1M"),
    ("4000000000", "4G"),
    ("1000e6", "1e9"),
    ("1.5e3", "1500"),
    ("0Gi", "0"),
    ("0.0m", "0"),
]
# Kept as written: already canonical, or a form ParseQuantity keeps (its string looks canonical).
KEPT = ["1Gi", "300Mi", "6Ki", "1001Gi", "1025", "5", "500m", "1G", "80m", "1080m", "300M", "1T", "1E", "3k", "0",
        "1e9", "1e-3", "80e-3", "300e6", "1n", "1080n", "1u", "1536Mi", "100Mi", "1073741824", "1e3", "1E3", "+1",
        "1.500k", "1500e0", "64Mi", "2Gi", "1Ti", "1500M"]  # fmt: skip


@pytest.mark.parametrize(("written", "stored"), STORED)
def test_a_quantity_is_written_as_the_api_server_stores_it(written: str, stored: str) -> None:
    assert quantity.canonical(written) == stored
    assert parse_quantity(stored) == parse_quantity(written)  # the kubernetes client's reading: the same amount


@pytest.mark.parametrize("written", KEPT)
def test_a_quantity_the_api_server_keeps_as_written_stays_so(written: str) -> None:
    assert quantity.canonical(written) == written


@pytest.mark.parametrize(
    ("written", "stored"),
    [("3.001n", "4n"), ("0.0000000001", "1n"), (".000000000001Ki", "2n"), ("9Ei", "9223372036854775807")],
)
def test_a_quantity_below_a_nano_is_rounded_up_and_a_binary_one_capped(written: str, stored: str) -> None:
    assert quantity.canonical(written) == stored


def test_a_whole_number_is_a_quantity_and_what_is_not_one_comes_back_as_written() -> None:
    assert quantity.canonical(2**30) == "1073741824"
    assert quantity.canonical(-1500) == "-1500"
    assert quantity.canonical("-0.5") == "-500m"
    assert [quantity.canonical(t) for t in ("lots", "1Zi", "1e", "")] == ["lots", "1Zi", "1e", ""]


def test_every_quantity_the_operator_renders_is_in_the_stored_form(settings: BuildSettings) -> None:
    cpus = {"resource": "limits.cpu", "divisor": "1000m"}
    svc = parse(
        dispatcher={
            "resources": {"requests": {"cpu": "0.5", "memory": "1024Mi"}, "limits": {"memory": 2048 * 2**20}},
            "storage": {"size": "1024Mi"},
            "tmpSizeLimit": "1024Mi",
        },
        workers={
            "resources": {"requests": {"cpu": "1000m"}, "limits": {"cpu": "2000m", "ephemeral-storage": "4096Mi"}},
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1024Mi"}}],
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            "env": [{"name": "CPUS", "valueFrom": {"resourceFieldRef": cpus}}],
        },
    )
    dispatcher = builders.build_dispatcher_statefulset(svc, settings, 2)
    workers = builders.build_worker_statefulset(svc, settings, 2)
    pod = dispatcher["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "1Gi"},
        "limits": {"memory": "2147483648"},  # a number: decimal, as the API server reads it
    }
    assert pod["volumes"][0]["emptyDir"] == {"sizeLimit": "1Gi"}
    claim = dispatcher["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["resources"] == {"requests": {"storage": "1Gi"}}
    pod = workers["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["requests"]["cpu"] == "1"
    assert pod["containers"][0]["resources"]["limits"] == {"cpu": "2", "ephemeral-storage": "4Gi"}
    assert [v.get("emptyDir") for v in pod["volumes"] if v["name"] == "scratch"] == [{"sizeLimit": "1Gi"}]
    (cpus,) = [e for e in pod["containers"][0]["env"] if e["name"] == "CPUS"]
    assert cpus["valueFrom"]["resourceFieldRef"]["divisor"] == "1"


def test_a_request_above_its_limit_is_refused_as_written() -> None:
    with pytest.raises(spec.SpecError, match=r"requests.cpu \(1.5\) exceeds .*limits.cpu \(1000m\)"):
        parse(workers={"resources": {"requests": {"cpu": "1.5"}, "limits": {"cpu": "1000m"}}})
