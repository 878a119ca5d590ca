"""The typed spec: what ``parse`` returns, its named values and its bounds.

One frozen dataclass per object of a TFDataService's ``spec`` (``ServiceSpec`` at the top), the
enumerations and limits the sections check against, ``SpecError``, and the volumes the operator
mounts into every server pod itself. No parsing here: the sections (``spec/*.py``) read into these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfdata_operator.wire import serverconfig
from tfdata_operator.wire.sharding import STATIC_POLICIES

# WorkerConfig.data_transfer_protocol: "grpc" is served by the worker's own gRPC server. Any
# other name needs a DataTransferServer registered under it, and the wheel registers none
# ("local" is only a client for in-process workers): the worker logs an error and silently
# falls back to gRPC. So no protocol ever uses spec.workers.dataTransferPort.
TRANSFER_PROTOCOLS = ("grpc",)
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
# spec.snapshots.directory: an absolute path, or a URL (spec/snapshots.py), of at most this many characters.
MAX_SNAPSHOT_DIR_LENGTH = 1024
# Unset, a server container requests this much of each resource for which it sets neither a
# request nor a limit: an idle TensorFlow server holds about 500 MB, and a worker runs the
# dataset's pipeline on top of that.
DEFAULT_REQUESTS = {"dispatcher": {"cpu": "100m", "memory": "512Mi"}, "worker": {"cpu": "250m", "memory": "1Gi"}}
# The most of the servers' millisecond timeouts and intervals (spec.dispatcher.*Ms, spec.workers.*Ms): a week.
MAX_MS = 604_800_000
# What the operator puts into every server pod itself: a user's volume, mount or variable of the
# same name would collide with it (a duplicate volume or mount path makes the StatefulSet invalid;
# a later variable of the same name would override the operator's, and the server would run with
# another configuration, pod name or namespace than its own).
TMP_VOLUME, TMP_MOUNT = "tmp", "/tmp"  # readOnlyRootFilesystem: TensorFlow still needs a /tmp
JOURNAL_VOLUME, JOURNAL_MOUNT = "journal", "/var/lib/tfdata"  # the dispatcher's, with spec.dispatcher.storage
DEFAULT_WORK_DIR = f"{JOURNAL_MOUNT}/journal"  # where it journals on that volume
SNAPSHOTS_VOLUME = "snapshots"  # spec.snapshots.volume, mounted at spec.snapshots.directory
# The emptyDir the injected server program lives in, at serverconfig.INJECT_MOUNT: reserved unless
# spec.serverProgram is FromImage (Auto injects for any image but the operator's default, which the
# CRD cannot see, so both doors reserve it under Auto too).
PROGRAM_VOLUME = "tfdata-server-program"
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


def operator_volumes(journal: bool, snapshots: SnapshotsSpec | None = None, program: bool = False) -> dict[str, str]:
    """The volumes the operator mounts into a server container (name -> mount path): the tmp
    emptyDir always, the journal claim on a dispatcher with ``spec.dispatcher.storage``, the
    snapshots claim in every server with ``spec.snapshots.volume``, and the injected server
    program's emptyDir where ``program`` (spec.serverProgram is not FromImage)."""
    mounts = {TMP_VOLUME: TMP_MOUNT, **({JOURNAL_VOLUME: JOURNAL_MOUNT} if journal else {})}
    if program:
        mounts[PROGRAM_VOLUME] = serverconfig.INJECT_MOUNT
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
    # None: the server program's default (serverconfig.DEFAULTS: on).
    gc_dynamic_sharding_jobs: bool | None = None
    pod: PodSettings = PodSettings()

    @property
    def journal_base(self) -> str | None:
        """Where the dispatcher journals: the user's workDir, or the journal volume, or nowhere."""
        return self.work_dir or (DEFAULT_WORK_DIR if self.storage.enabled else None)


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
class KueueSpec:
    """The labels ``kueue.x-k8s.io/queue-name`` and ``kueue.x-k8s.io/priority-class`` of the
    TFDataService: admitted through Kueue, in that LocalQueue (``plan/kueue.py``)."""

    queue: str
    priority_class: str | None = None


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
    # Admitted through Kueue (None: not queued).
    kueue: KueueSpec | None = None

    @property
    def is_static(self) -> bool:
        return self.sharding_policy in STATIC_POLICIES
