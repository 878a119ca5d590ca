"""spec.py's own limits, edge by edge, and the whole sentence of each refusal they make.

The API server's schema refuses most of these inputs too, but spec.py is a door of its own
(`tfdata-operator render`, and the operator's check before anything is written), so its limits
must be the CRD's and its sentences must say what to fix. ACCEPTED holds the last value inside
each limit, REFUSED the first outside it; golden/edge-refusals.txt holds what spec.py says of
each (`make golden` rewrites it after an intended change). `make mutation` found these edges
unpinned by the other tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tfdata_operator.api import spec

from fixtures.cases import IMAGE, body, parse
from fixtures.manifests import API_VERSION

# A valid DNS subdomain (a Secret's or ServiceAccount's name) of exactly 253 characters.
DNS_253 = ".".join(["a" * 61, "b" * 63, "c" * 63, "d" * 63])
PEER = {"podSelector": {"matchLabels": {"team": "vision"}}}
SPREAD = {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}


def workers(**fields: Any) -> dict[str, Any]:
    return {"workers": fields}


def many(count: int, prefix: str = "k") -> dict[str, str]:
    return {f"{prefix}{i}": "v" for i in range(count)}


def egress(excepted: list[Any]) -> dict[str, Any]:
    return {"networkPolicy": {"egress": {"enabled": True, "except": excepted}}}


def except_cidrs(count: int) -> list[str]:
    return [f"10.{i}.0.0/16" for i in range(count)]


# (id, spec fields, what the parsed spec must then say)
ACCEPTED: list[tuple[str, dict[str, Any], Callable[[spec.ServiceSpec], object]]] = [
    ("16-pull-secrets", {"imagePullSecrets": [{"name": f"s{i}"} for i in range(16)]},
     lambda s: len(s.image_pull_secrets) == 16),
    ("pull-secret-name-of-253", {"imagePullSecrets": [{"name": DNS_253}]},
     lambda s: s.image_pull_secrets == (DNS_253,)),
    ("service-account-of-253", workers(serviceAccountName=DNS_253),
     lambda s: s.workers.pod.service_account_name == DNS_253),
    ("work-dir-of-1024", {"dispatcher": {"workDir": "/" + "w" * 1023}},
     lambda s: s.dispatcher.work_dir == "/" + "w" * 1023),
    ("64-annotations", workers(annotations=many(64)), lambda s: len(s.workers.pod.annotations) == 64),
    ("annotation-of-4096", workers(annotations={"note": "n" * 4096}),
     lambda s: s.workers.pod.annotations["note"] == "n" * 4096),
    ("64-labels", workers(labels=many(64)), lambda s: len(s.workers.pod.labels) == 64),
    ("32-node-selector-entries", workers(nodeSelector=many(32)), lambda s: len(s.workers.pod.node_selector) == 32),
    ("8-spread-constraints", workers(topologySpreadConstraints=[SPREAD] * 8),
     lambda s: len(s.workers.pod.topology_spread_constraints or ()) == 8),
    ("label-key-of-317", workers(labels={"a" * 253 + "/" + "b" * 63: "v"}), lambda s: len(s.workers.pod.labels) == 1),
    ("16-network-policy-peers", {"networkPolicy": {"from": [PEER] * 16}},
     lambda s: len(s.network_policy.extra_from) == 16),
    ("network-policy-on-without-peers", {"networkPolicy": {"enabled": True}}, lambda s: s.network_policy.enabled),
    ("network-policy-off-with-peers", {"networkPolicy": {"enabled": False, "from": [PEER]}},
     lambda s: not s.network_policy.enabled),
    ("16-egress-excepts", egress(except_cidrs(16)),
     lambda s: s.network_policy.egress is not None and len(s.network_policy.egress.except_) == 16),
    ("egress-except-of-43", egress(["ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120"]),
     lambda s: s.network_policy.egress is not None and len(s.network_policy.egress.except_[0]) == 43),
    ("egress-except-a-host-and-a-slash-1", egress(["10.1.2.3/32", "128.0.0.0/1", "8000::/1", "::1/128"]),
     lambda s: s.network_policy.egress is not None and len(s.network_policy.egress.except_) == 4),
    ("egress-except-empty", egress([]),
     lambda s: s.network_policy.egress is not None and s.network_policy.egress.except_ == ()),
    ("egress-off-with-a-network-policy-off", {"networkPolicy": {"enabled": False, "egress": {"enabled": False}}},
     lambda s: s.network_policy.egress is None),
    ("volume-name-of-63", workers(volumes=[{"name": "v" * 63, "emptyDir": {}}]),
     lambda s: s.workers.pod.volumes[0]["name"] == "v" * 63),
    # Beside the operator's /tmp, not in it.
    ("mount-at-tmpX", workers(volumes=[{"name": "data", "emptyDir": {}}],
                              volumeMounts=[{"name": "data", "mountPath": "/tmpX"}]),
     lambda s: s.workers.pod.volume_mounts[0]["mountPath"] == "/tmpX"),
    ("tmp-size-limit-of-64Mi", workers(tmpSizeLimit="64Mi"), lambda s: s.workers.pod.tmp_size_limit == "64Mi"),
    ("tmp-size-limit-of-1Ti", {"dispatcher": {"tmpSizeLimit": "1Ti"}},
     lambda s: s.dispatcher.pod.tmp_size_limit == "1Ti"),
    ("tmp-size-limit-in-bytes", workers(tmpSizeLimit=2**30), lambda s: s.workers.pod.tmp_size_limit == str(2**30)),
    ("limits-without-requests", workers(resources={"limits": {"cpu": "2"}}),
     lambda s: s.workers.pod.resources == {"limits": {"cpu": "2"}}),
    ("request-equal-to-limit", workers(resources={"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}),
     lambda s: s.workers.pod.resources["requests"] == {"cpu": "1"}),
    ("when-deleted-retain", {"dispatcher": {"storage": {"whenDeleted": "Retain"}}},
     lambda s: s.dispatcher.storage.when_deleted == "Retain"),
    ("scale-down-window-120", {"shardingPolicy": "DYNAMIC", "autoscaling": {"maxReplicas": 4,
                                                                          "scaleDownStabilizationWindowSeconds": 120}},
     lambda s: s.autoscaling is not None and s.autoscaling.scale_down_stabilization_window_seconds == 120),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "holds"), [(f, h) for _, f, h in ACCEPTED], ids=[i for i, _, _ in ACCEPTED])
def test_the_last_value_inside_each_limit_is_accepted(fields: dict[str, Any], holds: Callable[..., object]) -> None:
    assert holds(parse(**fields))


BAD_VOLUME = {"name": "Bad_Volume", "emptyDir": {}}
# (id, spec fields): each refused; its whole sentence is in golden/edge-refusals.txt.
REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("pull-secrets-not-a-list", {"imagePullSecrets": "registry"}),
    ("17-pull-secrets", {"imagePullSecrets": [{"name": f"s{i}"} for i in range(17)]}),
    ("pull-secret-name-of-254", {"imagePullSecrets": [{"name": "a" + DNS_253}]}),
    ("pull-secrets-two-bad", {"imagePullSecrets": [{"nome": "x"}, {"name": "Bad_Name"}, {"name": "also bad"}]}),
    ("service-account-not-a-string", workers(serviceAccountName=5)),
    ("service-account-invalid", workers(serviceAccountName="Bad_Account")),
    ("work-dir-of-1025", {"dispatcher": {"workDir": "/" + "w" * 1024}}),
    ("annotations-not-a-map", workers(annotations="note")),
    ("65-annotations", workers(annotations=many(65))),
    ("annotations-two-too-long", workers(annotations={"a": "n" * 4097, "b": "n" * 4097})),
    ("65-labels", workers(labels=many(65))),
    ("33-node-selector-entries", workers(nodeSelector=many(33))),
    ("9-spread-constraints", workers(topologySpreadConstraints=[SPREAD] * 9)),
    ("labels-two-bad-keys", workers(labels={"bad key": "v", "worse key": "v"})),
    ("labels-two-bad-values", workers(labels={"a": "bad value", "b": "worse value"})),
    ("labels-two-reserved", workers(labels={"app.kubernetes.io/name": "x", "app.kubernetes.io/component": "y"})),
    # A bad key hides the rest: no second sentence about the reserved one.
    ("labels-bad-and-reserved", workers(labels={"bad key": "v", "app.kubernetes.io/name": "x"})),
    ("label-key-of-318", workers(labels={"a" * 254 + "/" + "b" * 63: "v"})),
    ("label-name-of-64", workers(labels={"b" * 64: "v"})),
    ("two-unknown-fields", workers(replica=2, prot=1)),
    ("storage-size-a-float", {"dispatcher": {"storage": {"size": 1.5}}}),
    ("request-a-float", workers(resources={"requests": {"cpu": 1.5}})),
    ("requests-two-bad", workers(resources={"requests": {"cpu": "lots", "memory": True}})),
    # Requests that are no map leave the limits checked.
    ("requests-not-a-map-and-a-bad-limit", workers(resources={"requests": "lots", "limits": {"cpu": True}})),
    ("request-above-limit", workers(resources={"requests": {"cpu": "2"}, "limits": {"cpu": "1"}})),
    ("tmp-size-limit-one-byte-below-64Mi", workers(tmpSizeLimit=64 * 2**20 - 1)),
    ("tmp-size-limit-one-byte-above-1Ti", {"dispatcher": {"tmpSizeLimit": 2**40 + 1}}),
    ("tmp-size-limit-a-float", workers(tmpSizeLimit=1.5)),
    ("17-network-policy-peers", {"networkPolicy": {"from": [PEER] * 17}}),
    ("17-egress-excepts", egress(except_cidrs(17))),
    ("egress-except-slash-0", egress(["0.0.0.0/0", "::/0"])),
    ("egress-except-bits-past-the-prefix", egress(["10.0.0.1/8"])),
    ("egress-except-without-a-prefix", egress(["169.254.169.254"])),
    ("egress-except-prefix-too-long", egress(["10.0.0.0/33", "fd00::/129"])),
    ("egress-except-uppercase-ipv6", egress(["FD00:EC2::254/128"])),
    ("egress-except-not-a-string", egress([32])),
    ("egress-except-twice", egress(["10.0.0.0/8", "10.0.0.0/8"])),
    # Even turned off, a bad CIDR is refused: turning it on later must not be what breaks the service.
    ("egress-off-with-a-bad-except", {"networkPolicy": {"egress": {"enabled": False, "except": ["nowhere"]}}}),
    ("egress-on-with-the-network-policy-off", {"networkPolicy": {"enabled": False, "egress": {"enabled": True}}}),
    ("volume-name-of-64", workers(volumes=[{"name": "v" * 64, "emptyDir": {}}])),
    # Wrong volumes hide the mounts' names, not the mounts' own problems.
    ("bad-volume-and-a-mount-of-another", workers(volumes=[BAD_VOLUME],
                                                  volumeMounts=[{"name": "other", "mountPath": "/data"}])),
    ("bad-volume-and-two-bad-mounts", workers(volumes=[BAD_VOLUME],
                                              volumeMounts=[{"name": "a", "mountPath": "/a"},
                                                            {"name": "b", "mountPath": "relative"}])),
    ("env-two-reserved", workers(env=[{"name": "POD_NAME", "value": "x"}, {"name": "POD_NAMESPACE", "value": "y"}])),
    # Only an operator started with --allow-host-path-volumes takes one.
    ("host-path-volume", workers(volumes=[{"name": "home", "hostPath": {"path": "/home"}}])),
    ("transfer-port-on-the-port", workers(port=5051, dataTransferPort=5051)),
    # A sentence that names a value the user did not write says it is the default.
    ("port-on-the-default-health-port", {"dispatcher": {"port": 8080}}),
    ("health-port-on-the-default-port", workers(healthPort=5051)),
    ("journal-nowhere-by-default", {"dispatcher": {"storage": {"enabled": False}}}),
    # Nothing to compare minReplicas with: only the maxReplicas sentence.
    ("min-above-a-refused-max", {"shardingPolicy": "DYNAMIC", "autoscaling": {"maxReplicas": 0, "minReplicas": 3}}),
]  # fmt: skip


def test_the_first_value_outside_each_limit_is_refused_with_its_golden_sentence(
    golden: Callable[[str, str], None],
) -> None:
    lines = []
    for case_id, fields in REFUSED:
        with pytest.raises(spec.SpecError) as err:
            parse(**fields)
        lines.append(f"{case_id}: {err.value}\n")
    golden("edge-refusals.txt", "".join(lines))


def test_metadata_and_spec_are_required_and_each_missing_one_is_named() -> None:
    with pytest.raises(spec.SpecError) as err:
        spec.parse({"apiVersion": API_VERSION, "kind": "TFDataService", "metadata": {}}, IMAGE)
    assert err.value.problems == ["metadata.name is required", "spec is required"]


def test_without_namespace_or_uid_the_service_is_in_default_with_no_uid() -> None:
    svc = spec.parse({"metadata": {"name": "demo"}, "spec": {}}, IMAGE)
    assert (svc.namespace, svc.uid) == ("default", "")


def test_without_an_image_and_without_a_default_the_refusal_says_both_ways_to_set_one() -> None:
    with pytest.raises(spec.SpecError) as err:
        spec.parse(body(), None)
    assert err.value.problems == [
        "spec.image is not set and the operator has no default server image: "
        "set spec.image, or start the operator with --server-image"
    ]


PROGRAM = spec.PROGRAM_VOLUME


@pytest.mark.parametrize("program", ["Injected", "Auto"])
def test_the_injected_programs_volume_and_the_paths_at_or_under_its_mount_are_refused_unless_from_image(
    program: str,
) -> None:
    workers = {
        "volumes": [{"name": PROGRAM, "emptyDir": {}}, {"name": "tools", "emptyDir": {}}],
        "volumeMounts": [
            {"name": "tools", "mountPath": "/opt/tfdata/bin"},
            {"name": PROGRAM, "mountPath": "/opt/tfdata"},
            {"name": "tools", "mountPath": "/opt/tfdata-tools"},  # beside it, not under it: allowed
        ],
    }
    with pytest.raises(spec.SpecError) as err:
        parse(image="example.com/trainer:1", serverProgram=program, workers=workers)
    assert err.value.problems == [
        f"spec.workers.volumes must not use the name {PROGRAM}: the operator adds its own {PROGRAM} volume "
        "(mounted at /opt/tfdata). Rename the volume, and its volumeMounts",
        "spec.workers.volumeMounts[0].mountPath must not be under /opt/tfdata (/opt/tfdata/bin): the operator mounts "
        f"the injected server program's {PROGRAM} volume there (spec.serverProgram Injected, or Auto). Mount at "
        "another path, e.g. /data, or set spec.serverProgram: FromImage if the image has tfdata-server",
        f"spec.workers.volumeMounts[1].mountPath must not be /opt/tfdata: the operator mounts its own {PROGRAM} "
        "volume there. Mount at another path, e.g. /data",
    ]
    # The image brings the program: nothing is injected, and the name and the path are the user's.
    svc = parse(image="example.com/tfdata-server:1", serverProgram="FromImage", workers=workers)
    assert not svc.inject_server and [m["mountPath"] for m in svc.workers.pod.volume_mounts] == [
        "/opt/tfdata/bin",
        "/opt/tfdata",
        "/opt/tfdata-tools",
    ]


@pytest.mark.parametrize(
    "directory", ["/opt/tfdata", "/opt/tfdata/", "/opt/tfdata/snapshots", "/opt//x/../tfdata/s", "/opt", "/opt/"]
)
def test_a_snapshot_volume_at_under_or_above_the_injected_program_is_refused_unless_from_image(directory: str) -> None:
    """Review N8's remainder: the snapshot claim mounted at, inside or around the injected program's
    mount (compared normalised) would collide with it or shadow it."""
    snapshots = {"directory": directory, "volume": {"claimName": "shared"}}
    for program in ("Injected", "Auto"):
        with pytest.raises(spec.SpecError) as err:
            parse(image="example.com/trainer:1", serverProgram=program, snapshots=snapshots)
        assert err.value.problems == [
            "spec.snapshots.directory must not be /opt/tfdata, under it or above it when a volume is mounted there "
            f"(got {directory}): the operator mounts the injected server program at /opt/tfdata (spec.serverProgram "
            "Injected, or Auto). Use another path, such as /snapshots, or set spec.serverProgram: FromImage if the "
            "image has tfdata-server"
        ]
    svc = parse(image="example.com/tfdata-server:1", serverProgram="FromImage", snapshots=snapshots)
    assert svc.snapshots is not None and svc.snapshots.claim_name == "shared"
    # Beside it, or without a volume (nothing mounted): allowed.
    for other in ({"directory": "/opt/tfdata-snapshots", "volume": {"claimName": "shared"}}, {"directory": "/opt"}):
        assert parse(image="example.com/trainer:1", serverProgram="Injected", snapshots=other).snapshots is not None


@pytest.mark.parametrize("text", ["lots", "1Zi", ""])
def test_parse_quantity_refuses_what_is_not_a_quantity(text: str) -> None:
    with pytest.raises(ValueError, match=f"^not a quantity: {text!r}$"):
        spec.parse_quantity(text)
