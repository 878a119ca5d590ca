"""Parsing, defaults and validation of the TFDataService spec."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tfdata_operator.api import coretypes, spec
from tfdata_operator.render import builders
from tfdata_operator.render.builders import BuildSettings
from tfdata_operator.wire import serverconfig

from fixtures.cases import BAD_SPECS, CRD_PATH, HOST_PATH, IMAGE, REQUESTS_ABOVE_LIMITS, BadSpec, body, manifest, parse


def test_empty_spec_gets_the_documented_defaults() -> None:
    svc = parse()
    assert svc.sharding_policy == "OFF"
    assert svc.image == IMAGE
    assert (svc.dispatcher.port, svc.dispatcher.health_port) == (5050, 8080)
    assert svc.dispatcher.fault_tolerant_mode is True
    assert svc.dispatcher.storage == spec.StorageSpec(enabled=True, size="1Gi", when_deleted="Retain")
    assert (svc.workers.replicas, svc.workers.port) == (2, 5051)
    assert svc.autoscaling is None
    assert not svc.is_static


@pytest.mark.parametrize("case", BAD_SPECS, ids=lambda c: c.id)
def test_every_bad_spec_is_refused_with_a_message_that_says_what_to_fix(case: BadSpec) -> None:
    doc = yaml.safe_load(manifest(case))
    with pytest.raises(spec.SpecError) as err:
        spec.parse(doc, IMAGE)
    assert case.operator_says in str(err.value)


def test_requests_above_limits_pass_the_schema_but_not_the_operator() -> None:
    doc = body(**yaml.safe_load(REQUESTS_ABOVE_LIMITS))
    with pytest.raises(spec.SpecError, match=r"requests.memory \(2Gi\) exceeds .*limits.memory \(1Gi\)"):
        spec.parse(doc, IMAGE)


def test_a_host_path_volume_is_refused_unless_the_operator_allows_it_and_the_refusal_says_how() -> None:
    doc = body(**yaml.safe_load(HOST_PATH))
    with pytest.raises(spec.SpecError) as err:
        spec.parse(doc, IMAGE)
    (problem,) = err.value.problems
    assert problem.startswith("spec.workers.volumes[0] (home) is a hostPath volume, which this operator refuses")
    assert "so whoever can create a TFDataService would control the node" in problem
    assert "--allow-host-path-volumes (the Helm chart's allowHostPathVolumes: true)" in problem
    allowed = spec.parse(doc, IMAGE, allow_host_path=True)
    assert allowed.workers.pod.volumes == ({"name": "home", "hostPath": {"path": "/home"}},)


def test_each_host_path_volume_of_both_components_is_named() -> None:
    volumes = [{"name": "data", "emptyDir": {}}, {"name": "logs", "hostPath": {"path": "/var/log"}}]
    with pytest.raises(spec.SpecError) as err:
        parse(dispatcher={"volumes": volumes}, workers={"volumes": volumes[1:]})
    assert [p.split(" is a ")[0] for p in err.value.problems] == [
        "spec.dispatcher.volumes[1] (logs)",
        "spec.workers.volumes[0] (logs)",
    ]


@pytest.mark.parametrize(
    "source",
    [
        {"nfs": {"server": "files.example", "path": "/data"}},
        {"csi": {"driver": "gcsfuse.csi.storage.gke.io"}},
        {"secret": {"secretName": "creds"}},
        {"persistentVolumeClaim": {"claimName": "data"}},
    ],
    ids=lambda s: next(iter(s)),
)
def test_volumes_that_do_not_reach_the_node_are_accepted_without_the_flag(source: dict[str, object]) -> None:
    assert parse(workers={"volumes": [{"name": "data", **source}]}).workers.pod.volumes[0]["name"] == "data"


@pytest.mark.parametrize("name", ["HOME", "KERAS_HOME", "PYTHONUNBUFFERED", "PYTHONPATH", "LD_LIBRARY_PATH"])
def test_env_names_the_operator_only_defaults_or_that_load_code_are_accepted(name: str) -> None:
    svc = parse(image="python-tf:2.16", workers={"env": [{"name": name, "value": "/data"}]})
    assert svc.workers.pod.env == ({"name": name, "value": "/data"},)


def test_env_names_the_operator_owns_are_refused_naming_them() -> None:
    with pytest.raises(spec.SpecError, match=r"spec\.workers\.env must not set POD_NAME, TFDATA_SERVER_CONFIG: the"):
        parse(workers={"env": [{"name": "TFDATA_SERVER_CONFIG", "value": "{}"}, {"name": "POD_NAME", "value": "x"}]})


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(spec.SpecError) as err:
        parse(shardingPolicy="RANDOM", workers={"replicas": 0, "port": 99999})
    assert len(err.value.problems) == 3


def test_missing_image_without_operator_default_is_refused() -> None:
    with pytest.raises(spec.SpecError, match="--server-image"):
        spec.parse(body(), None)


def test_static_policies() -> None:
    assert {p for p in spec.SHARDING_POLICIES if parse(shardingPolicy=p).is_static} == {
        "FILE",
        "DATA",
        "FILE_OR_DATA",
        "HINT",
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1Gi", 2**30), ("500m", 0.5), ("2", 2), ("1.5G", 1.5e9), ("1e3", 1000), ("128Mi", 128 * 2**20)],
)
def test_quantities_compare_by_value(text: str, expected: float) -> None:
    assert spec.parse_quantity(text) == pytest.approx(expected)


def test_tmp_size_limit_is_kept_as_the_api_server_stores_it() -> None:
    svc = parse(dispatcher={"tmpSizeLimit": "1024Mi"}, workers={"tmpSizeLimit": 4 * 2**30})
    assert (svc.dispatcher.pod.tmp_size_limit, svc.workers.pod.tmp_size_limit) == ("1Gi", "4294967296")


def _crd_defaults(schema: dict, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], object]:
    """Every scalar default in the CRD schema, by property path."""
    found = {}
    for key, prop in (schema.get("properties") or {}).items():
        if "default" in prop and prop["default"] != {}:
            found[(*path, key)] = prop["default"]
        found.update(_crd_defaults(prop, (*path, key)))
    return found


def _snake(name: str) -> str:
    name = name.replace("CPU", "Cpu")
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def test_python_defaults_equal_the_crd_defaults() -> None:
    crd = yaml.safe_load(CRD_PATH.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    defaults = _crd_defaults(schema)
    svc = parse(
        shardingPolicy="DYNAMIC",
        workers={"resources": {"requests": {"cpu": "1"}}},
        autoscaling={"maxReplicas": 9},
        lifecycle={"workload": {"apiVersion": "batch/v1", "kind": "Job", "name": "train"}, "afterWorkloadFinishes": {}},
    )
    checked = 0
    for path, crd_default in defaults.items():
        value: object = svc
        for part in path:
            if part == "shardingPolicy":
                value = parse().sharding_policy
                break
            if part == "serverProgram":  # kept only resolved: unset, it resolves as Auto does
                auto = (parse().inject_server, parse(image="python-tf:2.16").inject_server) == (False, True)
                value = spec.SERVER_PROGRAM_AUTO if auto else None
                break
            if part == "egress":  # kept only when enabled: unset, it is off, and on it has the default except
                on = parse(networkPolicy={"egress": {"enabled": True}}).network_policy.egress
                assert on is not None
                value = {"enabled": svc.network_policy.egress is not None, "except": list(on.except_)}[path[-1]]
                break
            if part == "tmpSizeLimit":  # one of the pod's settings
                value = value.pod  # type: ignore[attr-defined]
            value = getattr(value, _snake(part))
        assert value == crd_default, f"spec.{'.'.join(path)}: operator default {value!r}, CRD default {crd_default!r}"
        checked += 1
    assert checked >= 12


def test_autoscaling_defaults_to_the_operators_own_decisions_without_a_cpu_request() -> None:
    svc = parse(shardingPolicy="DYNAMIC", autoscaling={"maxReplicas": 4})
    assert svc.autoscaling == spec.AutoscalingSpec(
        max_replicas=4,
        min_replicas=1,
        metric="TFData",
        target_cpu_utilization_percentage=80,
        target_data_stall_percentage=10,
        scale_down="WhenIdle",
        scale_down_stabilization_window_seconds=300,
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"metric": "TFData"}, "WhenIdle"),
        ({"metric": "TFData", "scaleDown": "Always"}, "Always"),
        # What a CPU HorizontalPodAutoscaler does: it removes workers while clients read.
        ({"metric": "CPU"}, "Always"),
        ({"metric": "CPU", "scaleDown": "Always"}, "Always"),
    ],
)
def test_scale_down_mode_says_what_really_happens(fields: dict[str, str], expected: str) -> None:
    svc = parse(
        shardingPolicy="DYNAMIC",
        workers={"resources": {"requests": {"cpu": "1"}}},
        autoscaling={"maxReplicas": 4, **fields},
    )
    assert svc.autoscaling is not None and svc.autoscaling.scale_down == expected


# --- Volumes, volume mounts and environment variables -------------------------------------------

DATA_VOLUMES = {
    "volumes": [
        {"name": "tfrecords", "persistentVolumeClaim": {"claimName": "imagenet", "readOnly": True}},
        {"name": "gcs", "secret": {"secretName": "gcs-reader", "defaultMode": 0o440}},
    ],
    "volumeMounts": [
        {"name": "tfrecords", "mountPath": "/data", "readOnly": True},
        {"name": "gcs", "mountPath": "/var/run/secrets/gcs", "readOnly": True, "recursiveReadOnly": "IfPossible"},
    ],
    "env": [
        {"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/var/run/secrets/gcs/key.json"},
        {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "id"}}},
        {"name": "MEMORY", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
    ],
    "envFrom": [{"configMapRef": {"name": "tf-settings"}, "prefix": "TF_"}],
}


def test_volumes_mounts_and_env_are_unset_by_default() -> None:
    for pod in (parse().dispatcher.pod, parse().workers.pod):
        assert (pod.volumes, pod.volume_mounts, pod.env, pod.env_from) == ((), (), (), ())


@pytest.mark.parametrize("component", ["workers", "dispatcher"])
def test_volumes_mounts_and_env_are_kept_as_written(component: str) -> None:
    pod = getattr(parse(**{component: DATA_VOLUMES}), component).pod
    assert list(pod.volumes) == DATA_VOLUMES["volumes"]
    assert list(pod.volume_mounts) == DATA_VOLUMES["volumeMounts"]
    assert list(pod.env) == DATA_VOLUMES["env"]
    assert list(pod.env_from) == DATA_VOLUMES["envFrom"]


def test_the_journal_name_and_path_are_free_when_the_dispatcher_has_no_journal_volume() -> None:
    own = {
        "workDir": "/var/lib/tfdata/journal",
        "storage": {"enabled": False},
        "volumes": [{"name": "journal", "nfs": {"server": "nfs.example", "path": "/journals"}}],
        "volumeMounts": [{"name": "journal", "mountPath": "/var/lib/tfdata"}],
    }
    assert parse(dispatcher=own).dispatcher.pod.volume_mounts == tuple(own["volumeMounts"])
    # Workers never have a journal volume.
    workers = {"volumes": own["volumes"], "volumeMounts": own["volumeMounts"]}
    assert parse(workers=workers).workers.pod.volumes == tuple(own["volumes"])


def test_a_wrong_volume_is_blamed_once_not_again_on_its_mounts() -> None:
    with pytest.raises(spec.SpecError) as err:
        parse(
            workers={
                "volumes": [{"name": "data", "nfs": {"server": 1}}],
                "volumeMounts": [{"name": "data", "mountPath": "/d"}],
            }
        )
    assert err.value.problems == [
        "spec.workers.volumes[0].nfs.path is required",
        "spec.workers.volumes[0].nfs.server must be a string, got the number 1",
    ]


def test_every_problem_of_volumes_mounts_and_env_is_reported_at_once() -> None:
    with pytest.raises(spec.SpecError) as err:
        parse(
            workers={
                "volumes": [{"name": "data", "emptyDir": {}}],
                "volumeMounts": [
                    {"name": "data", "mountPath": "/d"},
                    {"name": "data", "mountPath": "/d"},
                    {"name": "x", "mountPath": "/tmp"},
                ],
                "env": [{"name": "A"}, {"name": "A"}, {"name": "POD_NAMESPACE"}],
            }
        )
    assert err.value.problems == [
        "spec.workers.volumeMounts has more than one item with mountPath '/d'",
        "spec.workers.volumeMounts[2].mountPath must not be /tmp: the operator mounts its own tmp volume there. "
        "Mount at another path, e.g. /data",
        "spec.workers.volumeMounts[2].name 'x' names no volume of spec.workers.volumes (the operator's own volumes "
        "cannot be mounted again). Declare the volume, or fix the name",
        "spec.workers.env has more than one item with name 'A'",
        "spec.workers.env must not set POD_NAMESPACE: the operator sets TFDATA_SERVER_CONFIG, POD_NAME, POD_NAMESPACE "
        "(the server's configuration, the pod's name and namespace) and the server needs its own values. "
        "Rename the variable",
    ]


@pytest.mark.parametrize(
    ("key", "limit", "item"),
    [
        ("volumes", spec.MAX_VOLUMES, {"name": "v", "emptyDir": {}}),
        ("volumeMounts", spec.MAX_MOUNTS, {"name": "v", "mountPath": "/v"}),
        ("env", spec.MAX_ENV, {"name": "V"}),
        ("envFrom", spec.MAX_ENV_FROM, {"secretRef": {"name": "v"}}),
    ],
)
def test_the_lists_are_bounded_like_the_crd_says(key: str, limit: int, item: dict) -> None:
    crd = yaml.safe_load(CRD_PATH.read_text())
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert {spec_schema[c]["properties"][key]["maxItems"] for c in ("dispatcher", "workers")} == {limit}
    with pytest.raises(spec.SpecError, match=f"spec.workers.{key} must be a list of at most {limit} items"):
        parse(workers={key: [item] * (limit + 1)})


def _rules(component: str) -> str:
    crd = yaml.safe_load(CRD_PATH.read_text())
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][component]
    rules = [r["rule"] for r in props["x-kubernetes-validations"]]
    rules += [
        r["rule"]
        for key in ("volumes", "volumeMounts")
        for r in props["properties"][key]["items"]["x-kubernetes-validations"]
    ]
    rules += [r["rule"] for r in props["properties"]["env"]["x-kubernetes-validations"]]
    return "\n".join(rules)


@pytest.mark.parametrize(("component", "journal"), [("dispatcher", True), ("workers", False)])
def test_the_crd_reserves_what_the_operator_reserves(component: str, journal: bool) -> None:
    """The CEL rules are hand-written: they must name exactly the operator's own volumes and variables."""
    rules = _rules(component)
    for name, path in spec.operator_volumes(journal=journal).items():
        assert f"v.name == '{name}'" in rules
        assert f"m.mountPath.matches('^{path}/*$')" in rules
    assert ("'journal'" in rules) is journal
    assert "[" + ", ".join(f"'{e}'" for e in spec.RESERVED_ENV) + "]" in rules
    sources = re.findall(r"has\(self\.(\w+)\)", rules.split("].filter(")[0].rsplit("[", 1)[-1])
    assert sorted(sources) == [f for f in coretypes.fields(coretypes.VOLUME) if f != "name"]


# --- Preloads -------------------------------------------------------------------------------------

MODULE_LIMIT = "a Python module name such as tensorflow_text of at most 128 characters"
LIBRARY_LIMIT = "an absolute path to a shared library (.so) of at most 1024 characters"


def test_the_preload_lists_are_bounded_like_the_crd_says() -> None:
    crd = yaml.safe_load(CRD_PATH.read_text())
    lists = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["preload"]
    bounds = {k: (v["maxItems"], v["items"]["maxLength"]) for k, v in lists["properties"].items()}
    assert bounds == {"modules": (spec.MAX_PRELOADS, 128), "opLibraries": (spec.MAX_PRELOADS, 1024)}
    # The last value inside each limit, kept as written and in order.
    modules = ["t", "m" * 128, *(f"ops{i}.text" for i in range(spec.MAX_PRELOADS - 2))]
    libraries = ["/" + "o" * 1023, "/opt/ops/libmyops.so"]
    svc = parse(preload={"modules": modules, "opLibraries": libraries})
    assert svc.preload == spec.PreloadSpec(modules=tuple(modules), op_libraries=tuple(libraries))


@pytest.mark.parametrize(
    ("preload", "problems"),
    [
        ({"modules": "tensorflow_text"}, ["spec.preload.modules must be a list of at most 16 strings"]),
        (
            {"opLibraries": [f"/opt/ops/{i}.so" for i in range(17)]},
            ["spec.preload.opLibraries must be a list of at most 16 strings"],
        ),
        # Every bad entry is named, with what to write instead.
        (
            {"modules": ["m" * 129, "tensorflow_text", 5]},
            [
                f"spec.preload.modules[0] must be {MODULE_LIMIT}, got '{'m' * 129}'",
                f"spec.preload.modules[2] must be {MODULE_LIMIT}, got 5",
            ],
        ),
        (
            {"opLibraries": ["", "/" + "o" * 1024]},
            [
                f"spec.preload.opLibraries[0] must be {LIBRARY_LIMIT}, got ''",
                f"spec.preload.opLibraries[1] must be {LIBRARY_LIMIT}, got '/{'o' * 1024}'",
            ],
        ),
        # Each entry listed more than once is named once.
        (
            {"modules": ["b", "tensorflow_text", "a", "b", "a", "b"]},
            ["spec.preload.modules lists an entry twice: ['a', 'b']"],
        ),
    ],
)
def test_a_bad_preload_list_is_refused_entry_by_entry(preload: dict[str, object], problems: list[str]) -> None:
    with pytest.raises(spec.SpecError) as err:
        parse(preload=preload)
    assert err.value.problems == problems


def test_zero_workers_only_for_a_service_that_scales_to_zero() -> None:
    zero = parse(shardingPolicy="DYNAMIC", workers={"replicas": 0}, autoscaling={"minReplicas": 0, "maxReplicas": 4})
    assert zero.workers.replicas == 0 and zero.autoscaling is not None and zero.autoscaling.min_replicas == 0
    refused = "spec.workers.replicas 0 is allowed only with spec.autoscaling.minReplicas 0 (scale to zero)"
    for fields in ({}, {"autoscaling": {"minReplicas": 1, "maxReplicas": 4}}):
        with pytest.raises(spec.SpecError, match=re.escape(refused)):
            parse(shardingPolicy="DYNAMIC", workers={"replicas": 0}, **fields)


@pytest.mark.parametrize(
    ("snapshots", "parsed"),
    [
        ({"directory": "gs://bucket/tfdata"}, spec.SnapshotsSpec("gs://bucket/tfdata")),
        ({"directory": "s3://bucket/tfdata"}, spec.SnapshotsSpec("s3://bucket/tfdata")),
        ({"directory": "/mnt/nfs/tfdata"}, spec.SnapshotsSpec("/mnt/nfs/tfdata")),
        (
            {"directory": "/snapshots", "volume": {"claimName": "shared-data"}},
            spec.SnapshotsSpec("/snapshots", claim_name="shared-data"),
        ),
    ],
)
def test_spec_snapshots_is_parsed(snapshots: dict[str, object], parsed: spec.SnapshotsSpec) -> None:
    assert parse(snapshots=snapshots).snapshots == parsed
    assert parse().snapshots is None


def test_a_snapshots_directory_of_1025_characters_is_refused_and_1024_accepted() -> None:
    assert parse(snapshots={"directory": "/" + "d" * 1023}).snapshots is not None
    with pytest.raises(spec.SpecError, match=r"spec\.snapshots\.directory must be 1 to 1024 characters long, got 1025"):
        parse(snapshots={"directory": "/" + "d" * 1024})


# --- spec.workers.crossTrainerCacheSize: within the workers' memory, into each worker's TensorFlow config --


def cached(size: Any, **resources: Any) -> dict[str, Any]:
    return {"workers": {"crossTrainerCacheSize": size, "resources": resources}}


def cache_refusal(fields: dict[str, Any]) -> str:
    with pytest.raises(spec.SpecError) as err:
        parse(**fields)
    (problem,) = err.value.problems
    return problem


def test_unset_cross_trainer_cache_leaves_tensorflows_default_and_writes_nothing_to_the_workers() -> None:
    svc = parse()
    assert svc.workers.cross_trainer_cache_size_bytes is None
    config = builders.worker_config(svc, BuildSettings())
    assert config.cross_trainer_cache_size_bytes is None
    assert "cross_trainer_cache" not in serverconfig.to_json(config)


@pytest.mark.parametrize(
    ("size", "resources", "expected"),
    [
        ("4Gi", {"limits": {"memory": "8Gi"}}, 4 * 2**30),
        ("1.5Gi", {"limits": {"memory": "2Gi"}}, 3 * 2**29),  # exactly the limit minus 512Mi
        (2**30, {"requests": {"memory": "2Gi"}}, 2**30),  # bytes; a request when there is no limit
        ("1Mi", {"limits": {"memory": "1Gi"}}, 2**20),
        ("2G", {"requests": {"memory": "1Gi"}, "limits": {"memory": "4Gi"}}, 2 * 10**9),  # the limit counts
    ],
)
def test_the_cross_trainer_cache_goes_to_every_worker_in_bytes(size: Any, resources: Any, expected: int) -> None:
    svc = parse(**cached(size, **resources))
    assert svc.workers.cross_trainer_cache_size_bytes == expected
    config = builders.worker_config(svc, BuildSettings())
    assert config.cross_trainer_cache_size_bytes == expected
    worker = serverconfig.from_json(serverconfig.to_json(config), "worker")
    assert isinstance(worker, serverconfig.WorkerServerConfig)
    assert worker.cross_trainer_cache_size_bytes == expected
    assert f'"cross_trainer_cache_size_bytes":{expected}' in serverconfig.to_json(config)


def test_a_cross_trainer_cache_without_worker_memory_is_refused_saying_what_to_set() -> None:
    assert cache_refusal(cached("2Gi")) == (
        "spec.workers.crossTrainerCacheSize (2Gi) needs a memory limit for the workers, to check that the cache "
        "fits: each worker keeps up to 2Gi in memory for each job read through the cross-trainer cache, beside the "
        "512Mi a TensorFlow worker holds itself. Set spec.workers.resources.limits.memory to at least 2560Mi "
        "(or requests.memory)"
    )
    # A CPU limit is no memory bound.
    assert "needs a memory limit" in cache_refusal(cached("2Gi", limits={"cpu": "2"}))


def test_a_cross_trainer_cache_that_does_not_fit_is_refused_with_both_ways_out() -> None:
    assert cache_refusal(cached("2Gi", limits={"memory": "2Gi"})) == (
        "spec.workers.crossTrainerCacheSize (2Gi) does not fit in the workers' memory: "
        "spec.workers.resources.limits.memory is 2Gi, and a worker needs the cache plus about 512Mi for TensorFlow "
        "itself. Set crossTrainerCacheSize to at most 1536Mi, or spec.workers.resources.limits.memory to at least "
        "2560Mi"
    )
    # One byte over the limit minus the margin; a request is the bound when there is no limit.
    one_over = 3 * 2**29 + 1
    assert "does not fit" in cache_refusal(cached(one_over, limits={"memory": "2Gi"}))
    assert "resources.requests.memory is 1Gi" in cache_refusal(cached("600Mi", requests={"memory": "1Gi"}))
    # The limit is the bound when both are set.
    assert "resources.limits.memory is 1Gi" in cache_refusal(
        cached("1Gi", requests={"memory": "512Mi"}, limits={"memory": "1Gi"})
    )


@pytest.mark.parametrize(
    ("size", "said"),
    [
        ("1023Ki", "must be between 1Mi and 1Ti, got 1023Ki"),
        (2**40 + 1, f"must be between 1Mi and 1Ti, got {2**40 + 1}"),
        ("0", "must be between 1Mi and 1Ti, got 0"),
        ("lots", "must be a quantity such as 1Gi or 500m, got 'lots'"),
        (1.5, "must be a quantity such as 1Gi or 500m"),
    ],
)
def test_a_cross_trainer_cache_out_of_range_is_refused(size: Any, said: str) -> None:
    problem = cache_refusal(cached(size, limits={"memory": "2Ti"}))
    assert problem.startswith("spec.workers.crossTrainerCacheSize ") and said in problem, problem


def test_the_crd_states_the_operators_cache_bounds_and_margin() -> None:
    schema = yaml.safe_load(CRD_PATH.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    workers = schema["properties"]["spec"]["properties"]["workers"]
    field = workers["properties"]["crossTrainerCacheSize"]
    (rule,) = field["x-kubernetes-validations"]
    assert f"quantity('{spec.MIN_CROSS_TRAINER_CACHE}')" in rule["rule"]
    assert f"quantity('{spec.MAX_CROSS_TRAINER_CACHE}')" in rule["rule"]
    fits = [r for r in workers["x-kubernetes-validations"] if "crossTrainerCacheSize" in r["rule"]]
    assert len(fits) == 2
    assert all(f"quantity('{spec.CACHE_MEMORY_MARGIN}')" in r["rule"] for r in fits[1:])
    assert spec.TENSORFLOW_DEFAULT_CROSS_TRAINER_CACHE in field["description"]
    assert spec.CACHE_MEMORY_MARGIN in field["description"]
