"""Parses, defaults and validates a TFDataService's ``spec`` into typed, immutable values.

The CRD's schema and CEL rules reject most bad input at ``kubectl apply`` time; this
module re-checks all of it (``tfdata-operator render`` sees files the API server never
saw) and adds what the schema cannot express, such as requests above limits. Defaults
here equal the CRD's (a unit test compares them).
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfdata_operator.api import coretypes, paths
from tfdata_operator.api.quantity import canonical as canonical_quantity
from tfdata_operator.wire import serverconfig
from tfdata_operator.wire.sharding import SHARDING_POLICIES, STATIC_POLICIES

# WorkerConfig.data_transfer_protocol: "grpc" is served by the worker's own gRPC server. Any
# other name needs a DataTransferServer registered under it, and the wheel registers none
# ("local" is only a client for in-process workers): the worker logs an error and silently
# falls back to gRPC. So no protocol ever uses spec.workers.dataTransferPort.
TRANSFER_PROTOCOLS = ("grpc",)
# The protocols that run a server of their own on dataTransferPort.
_ALTERNATIVE_PROTOCOLS: frozenset[str] = frozenset()
# DispatcherConfig.work_dir: the filesystems the wheel registers (tf.io.gfile.get_registered_schemes()
# is ram, file, gs and plain paths). ram:// is left out: it is gone when the dispatcher restarts,
# which is what the journal is for.
WORK_DIR_SCHEMES = ("file", "gs")
AUTOSCALING_POLICIES = frozenset({"OFF", "DYNAMIC"})
# spec.workers.rescalePolicy: when a static rescale or a suspend is carried out (see hold.py).
RESCALE_WHEN_IDLE, RESCALE_IMMEDIATE = "WhenIdle", "Immediate"
RESCALE_POLICIES = (RESCALE_WHEN_IDLE, RESCALE_IMMEDIATE)
# The StatefulSet controller labels each pod controller-revision-hash=<statefulset>-<hash of
# up to 10 digits>, and a label value has at most 63 characters: <name>-dispatcher must stay
# within 52, so the name within 41. Every other derived name is shorter (a unit test checks).
MAX_NAME_LENGTH = 41
RESERVED_LABELS = frozenset(
    {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/component",
        "app.kubernetes.io/managed-by",
    }
)
_QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_ABSOLUTE_PATH = re.compile(r"/[^\0]*")
_WORK_DIR = re.compile(r"^(/|(file|gs)://)\S*$")
# spec.snapshots.directory: an absolute path, or a URL of any filesystem the server image has
# (TensorFlow 2.21 registers file:// and gs://; an image with tensorflow-io adds s3:// and others).
_SNAPSHOT_DIR = serverconfig.SNAPSHOT_DIR
MAX_SNAPSHOT_DIR_LENGTH = 1024
# Service names are DNS-1035 labels (a letter first), and the Services are named after the service.
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Names of other objects (PriorityClass, ServiceAccount, StorageClass, Secret).
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_PATTERN_NAMES = {_DNS_SUBDOMAIN: "a Kubernetes object name (lowercase letters, digits, '-' and '.')"}
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
# Unset, a server container requests this much of each resource for which it sets neither a
# request nor a limit: an idle TensorFlow server holds about 500 MB, and a worker runs the
# dataset's pipeline on top of that.
DEFAULT_REQUESTS = {"dispatcher": {"cpu": "100m", "memory": "512Mi"}, "worker": {"cpu": "250m", "memory": "1Gi"}}
_MAX_MS = 604_800_000
# What the operator puts into every server pod itself: a user's volume, mount or variable of the
# same name would collide with it (a duplicate volume or mount path makes the StatefulSet invalid;
# a later variable of the same name would override the operator's, and the server would run with
# another configuration, pod name or namespace than its own).
TMP_VOLUME, TMP_MOUNT = "tmp", "/tmp"  # readOnlyRootFilesystem: TensorFlow still needs a /tmp
JOURNAL_VOLUME, JOURNAL_MOUNT = "journal", "/var/lib/tfdata"  # the dispatcher's, with spec.dispatcher.storage
SNAPSHOTS_VOLUME = "snapshots"  # spec.snapshots.volume, mounted at spec.snapshots.directory
RESERVED_ENV = (serverconfig.CONFIG_ENV, serverconfig.POD_NAME_ENV, serverconfig.POD_NAMESPACE_ENV)
# spec.<component>.tmpSizeLimit: the sizeLimit of the /tmp emptyDir, and (unless resources sets one) the
# container's ephemeral-storage request. The dispatcher writes next to nothing there; a worker's
# pipeline may spill or cache.
DEFAULT_TMP_SIZE_LIMIT = {"dispatcher": "1Gi", "worker": "2Gi"}
MIN_TMP_SIZE_LIMIT, MAX_TMP_SIZE_LIMIT = "64Mi", "1Ti"
# spec.workers.crossTrainerCacheSize: the most each worker keeps per cached job (TensorFlow's
# WorkerConfig.cross_trainer_cache_size_bytes; unset, TensorFlow's 10 GiB). It must fit in the
# workers' memory (their limit, else their request) with CACHE_MEMORY_MARGIN to spare: an idle
# TensorFlow worker process holds about 500 MB before any pipeline runs (520 MiB measured for a
# dispatcher, a worker and a client in one TensorFlow 2.21 process; DEFAULT_REQUESTS says the same).
MIN_CROSS_TRAINER_CACHE, MAX_CROSS_TRAINER_CACHE = "1Mi", "1Ti"
CACHE_MEMORY_MARGIN = "512Mi"
TENSORFLOW_DEFAULT_CROSS_TRAINER_CACHE = "10Gi"
EPHEMERAL_STORAGE = "ephemeral-storage"
# Volume sources that reach the node itself rather than storage of the namespace: a hostPath mounts
# a directory of the node into pods that run as uid 1000 (on many nodes a user who may sudo). Refused
# unless the operator runs with --allow-host-path-volumes. nfs, csi, secret and claims stay allowed:
# they reach a file server or the namespace's own objects, never the node's files.
NODE_VOLUME_SOURCES = ("hostPath",)
ALLOW_HOST_PATH_FLAG = "--allow-host-path-volumes"
# Bounds of spec.<component>.volumes, volumeMounts, env and envFrom (the CRD's maxItems).
MAX_VOLUMES, MAX_MOUNTS, MAX_ENV, MAX_ENV_FROM = 16, 16, 64, 16
# One line of printable text (spec.nodeLoss.fencedBy: quoted in the status and Events).
_PRINTABLE_LINE = re.compile(r"^[^\x00-\x1f\x7f]+$")
_PATTERN_NAMES[_PRINTABLE_LINE] = "one line of text, without control characters"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_describe = coretypes.describe


class SpecError(ValueError):
    """A TFDataService that cannot be run as written; ``problems`` say what to fix."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class PodSettings:
    """Resources, placement and metadata for the dispatcher's or the workers' pods."""

    resources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] | None = None
    # None: not set (the workers get a default anti-affinity); () set to an empty list.
    topology_spread_constraints: tuple[Mapping[str, Any], ...] | None = None
    priority_class_name: str | None = None
    service_account_name: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    # Kubernetes' Volume, VolumeMount, EnvVar and EnvFromSource, as the user wrote them.
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    env: tuple[Mapping[str, Any], ...] = ()
    env_from: tuple[Mapping[str, Any], ...] = ()
    # spec.<component>.tmpSizeLimit (a quantity).
    tmp_size_limit: str = "1Gi"


def operator_volumes(journal: bool, snapshots: SnapshotsSpec | None = None) -> dict[str, str]:
    """The volumes the operator mounts into a server container (name -> mount path): the tmp
    emptyDir always, the journal claim on a dispatcher with ``spec.dispatcher.storage``, and the
    snapshots claim in every server with ``spec.snapshots.volume``."""
    mounts = {TMP_VOLUME: TMP_MOUNT, **({JOURNAL_VOLUME: JOURNAL_MOUNT} if journal else {})}
    if snapshots is not None and snapshots.claim_name is not None:
        mounts[SNAPSHOTS_VOLUME] = snapshots.directory.rstrip("/") or "/"
    return mounts


@dataclass(frozen=True)
class SnapshotsSpec:
    """Where tf.data distributed snapshots of this service go (``spec.snapshots``)."""

    directory: str
    # A ReadWriteMany claim mounted at ``directory`` in the dispatcher and every worker.
    claim_name: str | None = None


@dataclass(frozen=True)
class StorageSpec:
    enabled: bool = True
    size: str = "1Gi"
    storage_class_name: str | None = None
    when_deleted: str = "Retain"


@dataclass(frozen=True)
class DispatcherSpec:
    port: int = 5050
    health_port: int = 8080
    fault_tolerant_mode: bool = True
    work_dir: str | None = None
    storage: StorageSpec = StorageSpec()
    job_gc_check_interval_ms: int | None = None
    job_gc_timeout_ms: int | None = None
    client_timeout_ms: int | None = None
    worker_timeout_ms: int | None = None
    worker_max_concurrent_snapshots: int | None = None
    pod: PodSettings = PodSettings()


@dataclass(frozen=True)
class WorkersSpec:
    replicas: int = 2
    port: int = 5051
    health_port: int = 8080
    heartbeat_interval_ms: int | None = None
    dispatcher_timeout_ms: int | None = None
    data_transfer_protocol: str | None = None
    data_transfer_port: int | None = None
    rescale_policy: str = RESCALE_WHEN_IDLE
    rescale_max_wait_seconds: int | None = None
    # How long drains wait on a signal or snapshots the operator cannot read (plan/drain.py).
    drain_unreadable_max_wait_seconds: int = 3600
    # spec.workers.crossTrainerCacheSize, in bytes; None: TensorFlow's default (10 GiB).
    cross_trainer_cache_size_bytes: int | None = None
    pod: PodSettings = PodSettings()


# spec.autoscaling.metric: TFData, the operator decides from the dispatcher's signals; CPU, a
# HorizontalPodAutoscaler does, from metrics-server.
TFDATA_METRIC, CPU_METRIC = "TFData", "CPU"
AUTOSCALING_METRICS = (TFDATA_METRIC, CPU_METRIC)
# spec.autoscaling.scaleDown: WhenIdle removes workers only while no client reads (DYNAMIC loses
# nothing); Always also removes idle workers while clients read (at most once).
SCALE_DOWN_WHEN_IDLE, SCALE_DOWN_ALWAYS = "WhenIdle", "Always"
SCALE_DOWN_MODES = (SCALE_DOWN_WHEN_IDLE, SCALE_DOWN_ALWAYS)


@dataclass(frozen=True)
class AutoscalingSpec:
    max_replicas: int
    min_replicas: int = 1
    metric: str = TFDATA_METRIC
    target_cpu_utilization_percentage: int = 80
    target_data_stall_percentage: int = 10
    # Not defaulted by the CRD: WhenIdle for TFData, and what an HPA does (Always) for CPU.
    scale_down: str = SCALE_DOWN_WHEN_IDLE
    scale_down_stabilization_window_seconds: int = 300


# spec.serverProgram: where the servers' program comes from. Injected: an init container copies
# it into the pod and spec.image needs only Python and TensorFlow (a trainer's image); FromImage:
# spec.image has tfdata-server (ours, or one built from it); Auto: FromImage for the operator's
# own server image, Injected for any other.
SERVER_PROGRAM_AUTO, SERVER_PROGRAM_INJECTED, SERVER_PROGRAM_FROM_IMAGE = "Auto", "Injected", "FromImage"
SERVER_PROGRAMS = (SERVER_PROGRAM_AUTO, SERVER_PROGRAM_INJECTED, SERVER_PROGRAM_FROM_IMAGE)
MAX_PRELOADS = 16


@dataclass(frozen=True)
class PreloadSpec:
    """Python modules imported and op libraries loaded in every server before it starts."""

    modules: tuple[str, ...] = ()
    op_libraries: tuple[str, ...] = ()


# spec.networkPolicy.egress.except: what the servers may not reach when their egress is restricted.
# The default is the cloud metadata server (GCE, AWS, Azure and most others at 169.254.169.254; AWS's
# IPv6 one at fd00:ec2::254), whose credentials a client's dataset graph could otherwise read.
DEFAULT_EGRESS_EXCEPT = ("169.254.169.254/32", "fd00:ec2::254/128")
MAX_EGRESS_EXCEPT = 16


@dataclass(frozen=True)
class EgressSpec:
    """spec.networkPolicy.egress: the servers may reach every pod and every address but ``except_``."""

    except_: tuple[str, ...] = DEFAULT_EGRESS_EXCEPT


@dataclass(frozen=True)
class NetworkPolicySpec:
    enabled: bool = True
    # Extra NetworkPolicyPeers allowed in, e.g. trainers in another namespace.
    extra_from: tuple[Mapping[str, Any], ...] = ()
    # None: the servers' egress is not restricted (spec.networkPolicy.egress.enabled false, the default).
    egress: EgressSpec | None = None


# spec.nodeLoss.dispatcher: what happens to a dispatcher pod whose node stopped answering (see
# plan/nodeloss.py). Recover: replaced at once when the node is known to be off, and after
# dispatcherReplaceAfterSeconds of a guess when that cannot harm its journal; Wait: only when the node
# is known to be off (the out-of-service taint, a deleted Node).
NODE_LOSS_RECOVER, NODE_LOSS_WAIT = "Recover", "Wait"
NODE_LOSS_DISPATCHER = (NODE_LOSS_RECOVER, NODE_LOSS_WAIT)
MAX_REPLACE_AFTER_SECONDS = 86_400
# No timeout of spec.nodeLoss is shorter: the node lifecycle controller taints a node unreachable 40-50 s
# after its last heartbeat, and a kubelet that misses that many is often only slow. A service stored
# before this least (the CRD allowed 0) keeps its value, which is used as this (and the status says so).
MIN_REPLACE_AFTER_SECONDS = 30
MAX_FENCED_BY_LENGTH = 256


@dataclass(frozen=True)
class NodeLossSpec:
    """What the operator does with the service's pods on a node that stops answering."""

    # How long a node must have been tainted unreachable (its taint's timeAdded) before a worker there
    # is replaced: a worker keeps no state (unless a snapshot is being written).
    replace_after_seconds: int = 60
    # The same for the dispatcher, whose journal is state: at least as long as Kubernetes' own eviction.
    dispatcher_replace_after_seconds: int = 300
    dispatcher: str = NODE_LOSS_RECOVER
    # Who makes sure a node that stopped answering no longer runs its pods (a person's words): with
    # it, a dispatcher whose journal other nodes reach is replaced on the timeout alone.
    fenced_by: str | None = None

    @property
    def worker_after(self) -> int:
        """replaceAfterSeconds as used: never below MIN_REPLACE_AFTER_SECONDS."""
        return max(MIN_REPLACE_AFTER_SECONDS, self.replace_after_seconds)

    @property
    def dispatcher_after(self) -> int:
        return max(MIN_REPLACE_AFTER_SECONDS, self.dispatcher_replace_after_seconds)


# spec.lifecycle (plan/lifecycle.py): what the service does when the workload it feeds finishes.
LIFECYCLE_SUSPEND, LIFECYCLE_DELETE = "Suspend", "Delete"
LIFECYCLE_ACTIONS = (LIFECYCLE_SUSPEND, LIFECYCLE_DELETE)
MAX_LIFECYCLE_SECONDS = 7 * 24 * 3600
# A workload's apiVersion (group/version, or v1) and kind, as Kubernetes spells them.
_API_VERSION = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?v[0-9]+((alpha|beta)[0-9]+)?$"
)
_KIND = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_PATTERN_NAMES[_API_VERSION] = "an apiVersion such as batch/v1 or jobset.x-k8s.io/v1alpha2"
_PATTERN_NAMES[_KIND] = "a kind as Kubernetes spells it, a capital letter first (Job, JobSet)"


@dataclass(frozen=True)
class WorkloadRef:
    """The object a service feeds (a Job, a JobSet...), in the service's namespace."""

    api_version: str
    kind: str
    name: str


@dataclass(frozen=True)
class AfterWorkloadFinishes:
    """Suspend or Delete, ``after_seconds`` after the workload finished."""

    action: str = LIFECYCLE_SUSPEND
    after_seconds: int = 0


@dataclass(frozen=True)
class IdleSpec:
    """Suspend after this long without any reading client."""

    suspend_after_seconds: int


@dataclass(frozen=True)
class LifecycleSpec:
    """When the service suspends or deletes itself: after its workload finishes, or when idle."""

    workload: WorkloadRef | None = None
    after_workload_finishes: AfterWorkloadFinishes | None = None
    # An ownerReference to the workload: Kubernetes' garbage collector deletes the service with it.
    delete_with_workload: bool = False
    idle: IdleSpec | None = None


@dataclass(frozen=True)
class ServiceSpec:
    """One TFDataService, fully defaulted: everything the builders need."""

    name: str
    namespace: str
    uid: str
    image: str
    # metadata.generation: names the journal a static dispatcher starts when its worker list changes.
    generation: int = 0
    sharding_policy: str = "OFF"
    image_pull_policy: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    dispatcher: DispatcherSpec = DispatcherSpec()
    workers: WorkersSpec = WorkersSpec()
    autoscaling: AutoscalingSpec | None = None
    network_policy: NetworkPolicySpec = NetworkPolicySpec()
    node_loss: NodeLossSpec = NodeLossSpec()
    snapshots: SnapshotsSpec | None = None
    lifecycle: LifecycleSpec = LifecycleSpec()
    # No pod runs: the Services, the journal claim and the address stay.
    suspend: bool = False
    # spec.serverProgram resolved: the server program is copied into the pods.
    inject_server: bool = False
    preload: PreloadSpec = PreloadSpec()

    @property
    def is_static(self) -> bool:
        return self.sharding_policy in STATIC_POLICIES


class _Reader:
    """Reads typed fields from one object of the spec, collecting problems with their paths."""

    def __init__(self, data: Any, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            problems.append(f"{path} must be an object, got {_describe(data)}")
            data = {}
        self.data: Mapping[str, Any] = data
        self.seen: set[str] = set()

    def _get(self, key: str) -> Any:
        self.seen.add(key)
        return self.data.get(key)

    def _fail(self, key: str, message: str) -> None:
        self.problems.append(f"{self.path}.{key} {message}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def integer(self, key: str, default: int | None, lo: int, hi: int) -> int | None:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self._fail(key, f"must be an integer, got {_describe(value)}")
            return default
        if not lo <= value <= hi:
            self._fail(key, f"must be between {lo} and {hi}, got {value}")
            return default
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self._fail(key, f"must be true or false, got {_describe(value)}")
            return default
        return value

    def string(
        self, key: str, default: str | None = None, max_length: int = 253, pattern: re.Pattern[str] | None = None
    ) -> str | None:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            self._fail(key, f"must be a string, got {_describe(value)}")
            return default
        if not value or len(value) > max_length:
            self._fail(key, f"must be 1 to {max_length} characters long, got {len(value)}")
            return default
        if pattern is not None and not pattern.match(value):
            what = _PATTERN_NAMES.get(pattern, f"match {pattern.pattern}")
            self._fail(key, f"has an invalid value {value!r}: it must be {what}")
            return default
        return value

    def enum(self, key: str, choices: tuple[str, ...], default: str | None) -> str | None:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool):
            hint = ' (YAML turns a bare OFF, ON, yes or no into a boolean: write "OFF" in quotes)'
            self._fail(key, f"must be one of {_choices(choices)}, got the boolean {str(value).lower()}{hint}")
            return default
        if value not in choices:
            self._fail(key, f"must be one of {_choices(choices)}, got {value!r}")
            return default
        assert isinstance(value, str)
        return value

    def quantity(self, key: str, default: str) -> str:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, str)) or not _QUANTITY.match(str(value)):
            self._fail(key, f"must be a quantity such as 1Gi or 500m, got {_describe(value)}")
            return default
        return str(value)

    def string_map(self, key: str, max_items: int, max_value: int) -> dict[str, str]:
        value = self._get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self._fail(key, f"must be a map of strings, got {_describe(value)}")
            return {}
        if len(value) > max_items:
            self._fail(key, f"must have at most {max_items} entries, got {len(value)}")
        bad = sorted(str(k) for k, v in value.items() if not isinstance(v, str) or len(v) > max_value)
        if bad:
            self._fail(key, f"values must be strings of at most {max_value} characters (check {', '.join(bad)})")
            return {}
        return {str(k): v for k, v in value.items()}

    def child(self, key: str) -> _Reader:
        return _Reader(self._get(key), f"{self.path}.{key}", self.problems)

    def raw(self, key: str) -> Any:
        return self._get(key)

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            self.problems.append(f"{self.path} has unknown fields: {', '.join(unknown)}")


def parse(body: Mapping[str, Any], default_image: str | None, *, allow_host_path: bool = False) -> ServiceSpec:
    """Turns a TFDataService object into a ServiceSpec, or raises SpecError listing every problem.

    ``allow_host_path``: the operator's --allow-host-path-volumes (hostPath volumes refused without it)."""
    problems: list[str] = []
    metadata = body.get("metadata") or {}
    name = str(metadata.get("name") or "")
    namespace = str(metadata.get("namespace") or "default")
    if not name:
        problems.append("metadata.name is required")
    elif len(name) > MAX_NAME_LENGTH or not _NAME.match(name):
        problems.append(
            f"metadata.name must be at most {MAX_NAME_LENGTH} characters of lowercase letters, digits "
            f"and '-', starting with a letter (the names of the Services, StatefulSets and pods derive "
            f"from it), got {name!r}"
        )

    if body.get("spec") is None:
        problems.append("spec is required")
    spec = _Reader(body.get("spec"), "spec", problems)
    policy = spec.enum("shardingPolicy", SHARDING_POLICIES, "OFF")
    image = spec.string("image", default_image, max_length=512)
    server_program = spec.enum("serverProgram", SERVER_PROGRAMS, SERVER_PROGRAM_AUTO)
    preload = _preload(spec.child("preload"))
    pull_policy = spec.enum("imagePullPolicy", ("Always", "IfNotPresent", "Never"), None)
    pull_secrets = _pull_secrets(spec.raw("imagePullSecrets"), problems)
    suspend = spec.boolean("suspend", False)
    snapshots = _snapshots(spec.child("snapshots")) if spec.has("snapshots") else None
    dispatcher = _dispatcher(spec.child("dispatcher"), snapshots)
    workers = _workers(spec.child("workers"), snapshots)
    autoscaling = _autoscaling(spec.child("autoscaling")) if spec.has("autoscaling") else None
    network_policy = _network_policy(spec.child("networkPolicy"))
    node_loss = _node_loss(spec.child("nodeLoss"))
    lifecycle = _lifecycle(spec.child("lifecycle"))
    spec.finish()
    if not allow_host_path:
        problems += _node_volumes("spec.dispatcher", dispatcher.pod) + _node_volumes("spec.workers", workers.pod)

    if not image:
        problems.append(
            "spec.image is not set and the operator has no default server image: "
            "set spec.image, or start the operator with --server-image"
        )
    if autoscaling is not None:
        if policy not in AUTOSCALING_POLICIES:
            problems.append(
                f'spec.autoscaling is allowed only with shardingPolicy DYNAMIC or "OFF", not {policy}: '
                "the static policies need a fixed list of workers"
            )
        if autoscaling.metric == CPU_METRIC and "cpu" not in workers.pod.resources.get("requests", {}):
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
    journal = dispatcher.work_dir or (f"{JOURNAL_MOUNT}/journal" if dispatcher.storage.enabled else None)
    where = paths.relation(journal, snapshots.directory) if snapshots is not None and journal is not None else None
    if snapshots is not None and dispatcher.fault_tolerant_mode and where in ("the same as", "inside"):
        named = "spec.dispatcher.workDir" if dispatcher.work_dir else "its default"
        problems.append(
            f"the dispatcher's journal ({journal}, {named}) "
            f"is {where} spec.snapshots.directory {snapshots.directory}, where trainers read and delete snapshots: "
            "a DELETE of a snapshot there could remove the journal. Set spec.dispatcher.workDir (or "
            "spec.snapshots.directory) so that neither lies inside the other"
        )
    if snapshots is not None and not dispatcher.fault_tolerant_mode:
        problems.append(
            "spec.snapshots needs spec.dispatcher.faultTolerantMode true: TensorFlow refuses a snapshot "
            "(distributed_save) on a dispatcher without a journal. Set faultTolerantMode to true (its default), "
            "or remove spec.snapshots"
        )
    if workers.replicas == 0 and (autoscaling is None or autoscaling.min_replicas > 0):
        problems.append(
            "spec.workers.replicas 0 is allowed only with spec.autoscaling.minReplicas 0 (scale to zero): "
            "set 1 or more, or set spec.suspend: true to stop every pod"
        )
    if problems:
        raise SpecError(problems)
    assert policy is not None and image is not None
    return ServiceSpec(
        name=name,
        namespace=namespace,
        uid=str(metadata.get("uid") or ""),
        image=image,
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


def _preload(r: _Reader) -> PreloadSpec:
    modules = _string_list(r, "modules", 128, serverconfig.MODULE_NAME, "a Python module name such as tensorflow_text")
    libraries = _string_list(r, "opLibraries", 1024, _ABSOLUTE_PATH, "an absolute path to a shared library (.so)")
    r.finish()
    return PreloadSpec(modules=modules, op_libraries=libraries)


def _string_list(r: _Reader, key: str, max_length: int, pattern: re.Pattern[str], what: str) -> tuple[str, ...]:
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


def _network_policy(r: _Reader) -> NetworkPolicySpec:
    enabled = r.boolean("enabled", True)
    peers = r.raw("from")
    egress = _egress(r.child("egress")) if r.has("egress") else None
    r.finish()
    if egress is not None and not enabled:
        r.problems.append(
            f"{r.path}.egress.enabled needs {r.path}.enabled: the egress rules are part of the service's "
            f"NetworkPolicy, which {r.path}.enabled false does not create"
        )
    if peers is None:
        return NetworkPolicySpec(enabled=enabled, egress=egress)
    if not isinstance(peers, list) or len(peers) > 16:
        r.problems.append(f"{r.path}.from must be a list of at most 16 NetworkPolicy peers")
        return NetworkPolicySpec(enabled=enabled, egress=egress)
    found = [
        p
        for i, peer in enumerate(peers)
        for p in coretypes.problems(peer, coretypes.NETWORK_POLICY_PEER, f"{r.path}.from[{i}]")
    ]
    r.problems.extend(found)
    return NetworkPolicySpec(enabled=enabled, extra_from=() if found else tuple(peers), egress=egress)


def _egress(r: _Reader) -> EgressSpec | None:
    """spec.networkPolicy.egress; None when it is not enabled."""
    enabled = r.boolean("enabled", False)
    value = r.raw("except")
    r.finish()
    if value is None:
        value = list(DEFAULT_EGRESS_EXCEPT)
    if not isinstance(value, list) or len(value) > MAX_EGRESS_EXCEPT:
        r.problems.append(f"{r.path}.except must be a list of at most {MAX_EGRESS_EXCEPT} CIDRs")
        return None
    cidrs = []
    for i, item in enumerate(value):
        problem = _cidr_problem(item)
        if problem:
            r.problems.append(f"{r.path}.except[{i}] {problem}")
        else:
            cidrs.append(item)
    if len(set(cidrs)) != len(cidrs):
        r.problems.append(f"{r.path}.except lists a CIDR twice: {sorted(c for c in set(cidrs) if cidrs.count(c) > 1)}")
    return EgressSpec(except_=tuple(cidrs)) if enabled else None


def _cidr_problem(value: Any) -> str | None:
    """Why ``value`` is not a CIDR that a NetworkPolicy's ipBlock.except accepts within 0.0.0.0/0 or ::/0."""
    example = "such as 169.254.169.254/32 or fd00:ec2::254/128"
    if not isinstance(value, str) or "/" not in value or len(value) > 64:
        return f"must be a CIDR {example} (an address, '/', a prefix length), got {_describe(value)}"
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError:
        return f"must be a CIDR {example} (an address, '/', a prefix length), got {value!r}"
    if network.prefixlen == 0:
        return f"must be narrower than /0 (the egress rule allows every address but these), got {value!r}"
    if str(network) != value:
        return f"must be written {str(network)!r} (its network's first address, in canonical form), got {value!r}"
    return None


def _lifecycle(r: _Reader) -> LifecycleSpec:
    workload = None
    if r.has("workload"):
        w = r.child("workload")
        api_version = w.string("apiVersion", max_length=253, pattern=_API_VERSION)
        kind = w.string("kind", max_length=63, pattern=_KIND)
        name = w.string("name", max_length=253, pattern=_DNS_SUBDOMAIN)
        w.finish()
        for key, value in (("apiVersion", api_version), ("kind", kind), ("name", name)):
            if value is None and not w.has(key):
                r.problems.append(f"{w.path}.{key} is required")
        if api_version and kind and name:
            workload = WorkloadRef(api_version, kind, name)
    after = None
    if r.has("afterWorkloadFinishes"):
        a, d = r.child("afterWorkloadFinishes"), AfterWorkloadFinishes()
        action = a.enum("action", LIFECYCLE_ACTIONS, d.action) or d.action
        seconds = a.integer("afterSeconds", d.after_seconds, 0, MAX_LIFECYCLE_SECONDS)
        a.finish()
        after = AfterWorkloadFinishes(action, d.after_seconds if seconds is None else seconds)
    with_workload = r.boolean("deleteWithWorkload", False)
    idle = None
    if r.has("idle"):
        i = r.child("idle")
        seconds = i.integer("suspendAfterSeconds", None, 1, MAX_LIFECYCLE_SECONDS)
        if not i.has("suspendAfterSeconds"):
            r.problems.append(f"{i.path}.suspendAfterSeconds is required: how long without a reader before suspending")
        i.finish()
        idle = IdleSpec(seconds) if seconds is not None else None
    r.finish()
    if not r.has("workload"):
        for key, given in (("afterWorkloadFinishes", after is not None), ("deleteWithWorkload", with_workload)):
            if given:
                r.problems.append(
                    f"{r.path}.{key} needs {r.path}.workload: name the Job (or other workload) it follows"
                )
    return LifecycleSpec(workload, after, with_workload, idle)


def _node_loss(r: _Reader) -> NodeLossSpec:
    d = NodeLossSpec()
    # 0 and up: a service stored when the CRD's least was 0 stays valid (the CRD's least is now
    # MIN_REPLACE_AFTER_SECONDS; its validation ratcheting keeps an unchanged value); it is used as 30.
    after = r.integer("replaceAfterSeconds", d.replace_after_seconds, 0, MAX_REPLACE_AFTER_SECONDS)
    dispatcher_after = r.integer(
        "dispatcherReplaceAfterSeconds",
        d.dispatcher_replace_after_seconds,
        MIN_REPLACE_AFTER_SECONDS,
        MAX_REPLACE_AFTER_SECONDS,
    )
    dispatcher = r.enum("dispatcher", NODE_LOSS_DISPATCHER, d.dispatcher)
    fenced_by = r.string("fencedBy", None, max_length=MAX_FENCED_BY_LENGTH, pattern=_PRINTABLE_LINE)
    r.finish()
    assert after is not None and dispatcher_after is not None and dispatcher is not None
    return NodeLossSpec(
        replace_after_seconds=after,
        dispatcher_replace_after_seconds=dispatcher_after,
        dispatcher=dispatcher,
        fenced_by=fenced_by,
    )


def _snapshots(r: _Reader) -> SnapshotsSpec | None:
    directory = r.string("directory", None, max_length=MAX_SNAPSHOT_DIR_LENGTH)
    volume = r.child("volume")
    claim = volume.string("claimName", pattern=_DNS_SUBDOMAIN) if r.has("volume") else None
    volume.finish()
    r.finish()
    if directory is None:
        if not r.has("directory"):
            r.problems.append(f"{r.path}.directory is required: where the snapshots go (gs://bucket/path or /path)")
        return None
    if not _SNAPSHOT_DIR.fullmatch(directory):
        r.problems.append(
            f"{r.path}.directory must be an absolute path or a URL such as gs://bucket/path, got {directory!r}"
        )
        return None
    if r.has("volume") and claim is None and not volume.has("claimName"):
        r.problems.append(f"{r.path}.volume.claimName is required: the ReadWriteMany claim to mount at the directory")
    if claim is not None and not directory.startswith("/"):
        r.problems.append(
            f"{r.path}.volume is mounted at {r.path}.directory, so the directory must be an absolute path, "
            f"got {directory!r}: remove the volume to write to a URL, or give a path such as /snapshots"
        )
        return None
    if claim is not None and (directory.rstrip("/") or "/") in ("/", TMP_MOUNT, JOURNAL_MOUNT):
        r.problems.append(
            f"{r.path}.directory must not be {directory} when a volume is mounted there: the pods need it "
            "for themselves. Use another path, such as /snapshots"
        )
        return None
    return SnapshotsSpec(directory=directory, claim_name=claim)


def _dispatcher(r: _Reader, snapshots: SnapshotsSpec | None = None) -> DispatcherSpec:
    d = DispatcherSpec()
    port = r.integer("port", d.port, 1, 65535)
    health_port = r.integer("healthPort", d.health_port, 1, 65535)
    fault_tolerant = r.boolean("faultTolerantMode", d.fault_tolerant_mode)
    work_dir = r.string("workDir", None, max_length=1024)
    if work_dir is not None and not _WORK_DIR.match(work_dir):
        r.problems.append(
            f"spec.dispatcher.workDir must be an absolute path or a {' or '.join(WORK_DIR_SCHEMES)} URL "
            f"(the filesystems TensorFlow 2.21 has), got {work_dir!r}"
        )
        work_dir = None
    storage = _storage(r.child("storage"))
    ms = {
        key: r.integer(key, None, 1, _MAX_MS) for key in ("jobGcCheckIntervalMs", "clientTimeoutMs", "workerTimeoutMs")
    }
    ms["jobGcTimeoutMs"] = r.integer("jobGcTimeoutMs", None, -1, _MAX_MS)  # -1: never collect jobs
    if ms["jobGcTimeoutMs"] == 0:
        r.problems.append("spec.dispatcher.jobGcTimeoutMs must be -1 (keep jobs forever) or at least 1")
    concurrent_snapshots = r.integer("workerMaxConcurrentSnapshots", None, 0, 1000)
    pod = _pod_settings(r, operator_volumes(journal=storage.enabled, snapshots=snapshots), "dispatcher")
    r.finish()
    if port == health_port:
        r.problems.append(_same_ports(r, port))
    if fault_tolerant and work_dir is None and not storage.enabled:
        default = "" if r.has("faultTolerantMode") else " (true by default)"
        r.problems.append(
            f"spec.dispatcher.faultTolerantMode{default} needs somewhere to journal, and "
            "spec.dispatcher.storage.enabled is false with no spec.dispatcher.workDir: set storage.enabled to "
            "true (its default), set a workDir, or set faultTolerantMode to false"
        )
    assert port is not None and health_port is not None
    return DispatcherSpec(
        port=port,
        health_port=health_port,
        fault_tolerant_mode=fault_tolerant,
        work_dir=work_dir,
        storage=storage,
        job_gc_check_interval_ms=ms["jobGcCheckIntervalMs"],
        job_gc_timeout_ms=ms["jobGcTimeoutMs"],
        client_timeout_ms=ms["clientTimeoutMs"],
        worker_timeout_ms=ms["workerTimeoutMs"],
        worker_max_concurrent_snapshots=concurrent_snapshots,
        pod=pod,
    )


def _storage(r: _Reader) -> StorageSpec:
    d = StorageSpec()
    storage = StorageSpec(
        enabled=r.boolean("enabled", d.enabled),
        size=canonical_quantity(r.quantity("size", d.size)),
        storage_class_name=r.string("storageClassName", pattern=_DNS_SUBDOMAIN),
        when_deleted=r.enum("whenDeleted", ("Retain", "Delete"), d.when_deleted) or d.when_deleted,
    )
    r.finish()
    return storage


def _workers(r: _Reader, snapshots: SnapshotsSpec | None = None) -> WorkersSpec:
    d = WorkersSpec()
    # 0 only for a service scaled to zero (spec.autoscaling.minReplicas 0; parse checks).
    replicas = r.integer("replicas", d.replicas, 0, 1000)
    port = r.integer("port", d.port, 1, 65535)
    health_port = r.integer("healthPort", d.health_port, 1, 65535)
    heartbeat = r.integer("heartbeatIntervalMs", None, 1, 3_600_000)
    dispatcher_timeout = r.integer("dispatcherTimeoutMs", None, 1, _MAX_MS)
    protocol = r.enum("dataTransferProtocol", TRANSFER_PROTOCOLS, None)
    transfer_port = r.integer("dataTransferPort", None, 1, 65535)
    rescale_policy = r.enum("rescalePolicy", RESCALE_POLICIES, RESCALE_WHEN_IDLE)
    max_wait = r.integer("rescaleMaxWaitSeconds", None, 1, 604_800)
    unreadable_wait = r.integer("drainUnreadableMaxWaitSeconds", d.drain_unreadable_max_wait_seconds, 60, 604_800)
    pod = _pod_settings(r, operator_volumes(journal=False, snapshots=snapshots), "worker")
    cache = _cross_trainer_cache(r, pod)
    r.finish()
    if port == health_port:
        r.problems.append(_same_ports(r, port))
    if transfer_port is not None and transfer_port in (port, health_port):
        r.problems.append("spec.workers.dataTransferPort must differ from spec.workers.port and healthPort")
    if transfer_port is not None and protocol not in _ALTERNATIVE_PROTOCOLS:
        # Not "set a protocol": none of TensorFlow 2.21's uses the port.
        used = f" with dataTransferProtocol {protocol}" if protocol else ""
        r.problems.append(
            f"spec.workers.dataTransferPort is not used{used}: TensorFlow 2.21 "
            "sends elements over the workers' gRPC port (spec.workers.port); remove dataTransferPort"
        )
    if max_wait is not None and rescale_policy == RESCALE_IMMEDIATE:
        r.problems.append(
            "spec.workers.rescaleMaxWaitSeconds applies only with rescalePolicy WhenIdle: an Immediate change "
            "never waits. Remove rescaleMaxWaitSeconds or the rescalePolicy"
        )
    assert replicas is not None and port is not None and health_port is not None and rescale_policy is not None
    assert unreadable_wait is not None
    return WorkersSpec(
        replicas=replicas,
        port=port,
        health_port=health_port,
        heartbeat_interval_ms=heartbeat,
        dispatcher_timeout_ms=dispatcher_timeout,
        data_transfer_protocol=protocol,
        data_transfer_port=transfer_port,
        rescale_policy=rescale_policy,
        rescale_max_wait_seconds=max_wait,
        drain_unreadable_max_wait_seconds=unreadable_wait,
        cross_trainer_cache_size_bytes=cache,
        pod=pod,
    )


def _cross_trainer_cache(r: _Reader, pod: PodSettings) -> int | None:
    """spec.workers.crossTrainerCacheSize in bytes, refused when it cannot fit in a worker's memory."""
    key = "crossTrainerCacheSize"
    if not r.has(key):
        r.raw(key)  # seen: an explicit null is unset
        return None
    value = r.quantity(key, "")
    if not value:
        return None  # refused by quantity() already
    size = quantity_bytes(value)
    low, high = quantity_bytes(MIN_CROSS_TRAINER_CACHE), quantity_bytes(MAX_CROSS_TRAINER_CACHE)
    if not low <= size <= high:
        r._fail(
            key,
            f"must be between {MIN_CROSS_TRAINER_CACHE} and {MAX_CROSS_TRAINER_CACHE}, got {value}: it is the most "
            "each worker keeps in memory for each job read through the cross-trainer cache",
        )
        return None
    where, memory = _memory_bound(pod)
    margin = quantity_bytes(CACHE_MEMORY_MARGIN)
    if memory is None:
        r._fail(
            key,
            f"({value}) needs a memory limit for the workers, to check that the cache fits: each worker keeps up "
            f"to {value} in memory for each job read through the cross-trainer cache, beside the {CACHE_MEMORY_MARGIN} "
            f"a TensorFlow worker holds itself. Set {r.path}.resources.limits.memory to at least "
            f"{_bytes_text(size + margin)} (or requests.memory)",
        )
        return None
    if size + margin > memory:
        r._fail(
            key,
            f"({value}) does not fit in the workers' memory: {r.path}.resources.{where}.memory is "
            f"{_bytes_text(memory)}, and a worker needs the cache plus about {CACHE_MEMORY_MARGIN} for TensorFlow "
            f"itself. Set crossTrainerCacheSize to at most {_bytes_text(memory - margin)}, or "
            f"{r.path}.resources.{where}.memory to at least {_bytes_text(size + margin)}",
        )
        return None
    return size


def _memory_bound(pod: PodSettings) -> tuple[str, int | None]:
    """The memory a worker container may count on: its limit, else its request (None: neither set)."""
    for where in ("limits", "requests"):
        amount = pod.resources.get(where, {}).get("memory")
        if amount is not None:
            return where, quantity_bytes(amount)
    return "limits", None


def quantity_bytes(value: str | int) -> int:
    """A quantity of bytes as a whole number, rounded up (``1.5Gi`` is 1610612736, ``1k`` 1000)."""
    return math.ceil(parse_quantity(str(value)))


def _bytes_text(size: int) -> str:
    """``size`` as the quantity people write: ``1536Mi``, ``2Gi`` (rounded up to a whole Mi)."""
    return canonical_quantity(f"{-(-size // 2**20)}Mi")


def _same_ports(r: _Reader, port: int | None) -> str:
    """The refusal of a pod's port that is its health port, naming a default the user did not write."""
    default = next((f", the default {key}" for key in ("port", "healthPort") if not r.has(key)), "")
    return f"{r.path}.port and {r.path}.healthPort must differ (both are {port}{default})"


def _autoscaling(r: _Reader) -> AutoscalingSpec:
    if not r.has("maxReplicas"):
        r.problems.append("spec.autoscaling.maxReplicas is required")
    d = AutoscalingSpec(max_replicas=1)
    max_replicas = r.integer("maxReplicas", None, 1, 1000)
    min_replicas = r.integer("minReplicas", d.min_replicas, 0, 1000)
    metric = r.enum("metric", AUTOSCALING_METRICS, d.metric) or d.metric
    target = r.integer("targetCPUUtilizationPercentage", d.target_cpu_utilization_percentage, 1, 100)
    stall_set = r.has("targetDataStallPercentage")
    stall = r.integer("targetDataStallPercentage", d.target_data_stall_percentage, 1, 100)
    scale_down = r.enum("scaleDown", SCALE_DOWN_MODES, None)
    window = r.integer("scaleDownStabilizationWindowSeconds", d.scale_down_stabilization_window_seconds, 0, 3600)
    r.finish()
    assert min_replicas is not None and target is not None and stall is not None and window is not None
    # No maxReplicas (missing or refused above) leaves nothing the user wrote to compare with.
    if max_replicas is not None and min_replicas > max_replicas:
        r.problems.append(f"spec.autoscaling.minReplicas ({min_replicas}) must not exceed maxReplicas ({max_replicas})")
    if metric == CPU_METRIC and scale_down == SCALE_DOWN_WHEN_IDLE:
        r.problems.append(
            "spec.autoscaling.scaleDown WhenIdle needs metric TFData: a CPU HorizontalPodAutoscaler removes "
            "workers while clients read. Remove scaleDown, set it to Always, or use metric TFData"
        )
    if metric == CPU_METRIC and min_replicas == 0:
        r.problems.append(
            "spec.autoscaling.minReplicas 0 (scale to zero) needs metric TFData: a HorizontalPodAutoscaler keeps "
            "at least one worker. Set minReplicas to 1 or more, or use metric TFData"
        )
    if metric == CPU_METRIC and stall_set:
        r.problems.append(
            "spec.autoscaling.targetDataStallPercentage is used only by metric TFData: remove it, or use metric TFData"
        )
    return AutoscalingSpec(
        max_replicas=max_replicas or d.max_replicas,  # the default only beside a problem: parse raises
        min_replicas=min_replicas,
        metric=metric,
        target_cpu_utilization_percentage=target,
        target_data_stall_percentage=stall,
        scale_down=scale_down or (SCALE_DOWN_ALWAYS if metric == CPU_METRIC else SCALE_DOWN_WHEN_IDLE),
        scale_down_stabilization_window_seconds=window,
    )


def _pod_settings(r: _Reader, own_volumes: Mapping[str, str], component: str) -> PodSettings:
    resources = _resources(r.child("resources"))
    tmp_size_limit = _tmp_size_limit(r, DEFAULT_TMP_SIZE_LIMIT[component])
    labels = _labels(r, "labels", 64)
    reserved = sorted(RESERVED_LABELS & set(labels))
    if reserved:
        r.problems.append(
            f"{r.path}.labels must not set {', '.join(reserved)}: the operator uses them to select its pods"
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
        priority_class_name=r.string("priorityClassName", pattern=_DNS_SUBDOMAIN),
        service_account_name=r.string("serviceAccountName", pattern=_DNS_SUBDOMAIN),
        labels=labels,
        annotations=r.string_map("annotations", 64, 4096),
        volumes=volumes or (),
        volume_mounts=mounts,
        env=_env(r),
        env_from=_core_list(r, "envFrom", coretypes.ENV_FROM_SOURCE, MAX_ENV_FROM) or (),
        tmp_size_limit=tmp_size_limit,
    )


def _tmp_size_limit(r: _Reader, default: str) -> str:
    value = r.quantity("tmpSizeLimit", default)
    if not _QUANTITY.match(value):
        return default  # refused by quantity() already
    low, high = parse_quantity(MIN_TMP_SIZE_LIMIT), parse_quantity(MAX_TMP_SIZE_LIMIT)
    if not low <= parse_quantity(value) <= high:
        r.problems.append(
            f"{r.path}.tmpSizeLimit must be between {MIN_TMP_SIZE_LIMIT} and {MAX_TMP_SIZE_LIMIT}, got {value}: "
            "it bounds the pod's /tmp, and the pod requests that much of its node's disk"
        )
        return default
    return canonical_quantity(value)


def _node_volumes(path: str, pod: PodSettings) -> list[str]:
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


def _volumes(r: _Reader, own: Mapping[str, str]) -> tuple[Mapping[str, Any], ...] | None:
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
    r: _Reader, volumes: tuple[Mapping[str, Any], ...] | None, own: Mapping[str, str]
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
        if r.has("volumes") and volumes is None:
            continue  # the volumes are wrong already: each mount's name cannot be checked
        if mount["name"] not in {v["name"] for v in volumes or ()}:
            problems.append(
                f"{where}.name {mount['name']!r} names no volume of {r.path}.volumes (the operator's own "
                "volumes cannot be mounted again). Declare the volume, or fix the name"
            )
    r.problems.extend(problems)
    return () if problems else mounts


def _env(r: _Reader) -> tuple[Mapping[str, Any], ...]:
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


def _duplicates(r: _Reader, key: str, field_name: str, items: tuple[Mapping[str, Any], ...]) -> list[str]:
    """Kubernetes keys these lists by ``field_name``: a value given twice is refused (or overridden)."""
    counts = Counter(str(item[field_name]) for item in items)
    twice = sorted(v for v, n in counts.items() if n > 1)
    return [f"{r.path}.{key} has more than one item with {field_name} {v!r}" for v in twice]


def _core_list(r: _Reader, key: str, definition: str, max_items: int) -> tuple[Mapping[str, Any], ...] | None:
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


def _labels(r: _Reader, key: str, max_items: int) -> dict[str, str]:
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


def _resources(r: _Reader) -> dict[str, dict[str, str]]:
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
            if isinstance(amount, bool) or not isinstance(amount, (int, str)) or not _QUANTITY.match(str(amount)):
                r.problems.append(
                    f"{r.path}.{kind}.{resource} must be a quantity such as 500m or 1Gi, got {_describe(amount)}"
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
        if len(item["name"]) > 253 or not _DNS_SUBDOMAIN.match(item["name"]):
            problems.append(f"spec.imagePullSecrets[{i}].name {item['name']!r} is not a valid Secret name")
            continue
        names.append(item["name"])
    return tuple(names)


_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": 10**-9, "u": 10**-6, "m": 10**-3, "": 1,
    "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip


def parse_quantity(value: str) -> float:
    """The numeric value of a Kubernetes quantity (only to compare requests with limits)."""
    match = re.fullmatch(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)", value)
    if not match or match.group(2) not in _SUFFIXES:
        raise ValueError(f"not a quantity: {value!r}")
    return float(match.group(1)) * _SUFFIXES[match.group(2)]


def _choices(choices: tuple[str, ...]) -> str:
    return ", ".join(f'"{c}"' if c == "OFF" else c for c in choices)
