"""The kinds of objects a TFDataService owns or watches: one table, and everything derived from it.

From ``OBSERVED`` come the operator's watches (kopf indexes and event handlers, with the
server-side label selector), the observe step (what a reconcile sees), which kinds a
reconcile may delete, the API paths, and the RBAC rules the chart must grant (a test
compares them), and what a reconcile applies and deletes (``desired.desired_children`` renders
each row in order). A new child kind is one row here plus its render function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tfdata_operator.api import kueue
from tfdata_operator.api.identity import API_GROUP, API_VERSION, KIND, PLURAL, SNAPSHOT_KIND, SNAPSHOT_PLURAL
from tfdata_operator.api.spec import ServiceSpec
from tfdata_operator.render import builders
from tfdata_operator.render.builders import BuildSettings, Counts, Named

Render = Callable[[ServiceSpec, BuildSettings, Counts], list[Named]]


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    # What the operator does with objects of this kind beyond list and watch.
    verbs: tuple[str, ...]
    # Why the operator needs those verbs (the chart's RBAC comments say the same).
    why: str
    # A child kind's objects for a service, in the order they are applied (None: not a child).
    render: Render | None = None

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    @property
    def index(self) -> str:
        """The name of this kind's kopf index (also the keyword its handlers receive)."""
        return f"{self.plural}_by_instance"


# Children written by server-side apply (an apply that creates an object also needs create).
APPLY = ("create", "patch")

# In the order a reconcile applies them. A kind whose render can give None for an object (the
# spec does not ask for it) needs "delete": the plan deletes such an object when it exists.
CHILDREN: tuple[Kind, ...] = (
    Kind("v1", "Service", "services", APPLY, "dispatcher address and worker DNS names", builders.render_services),
    Kind(
        "v1", "ConfigMap", "configmaps", APPLY, "the settings trainers read (<name>-client)", builders.render_configmaps
    ),
    Kind(
        "apps/v1",
        "StatefulSet",
        "statefulsets",
        (*APPLY, "delete"),
        "dispatcher and workers; recreated when a field Kubernetes cannot update changes",
        builders.render_statefulsets,
    ),
    Kind(
        "autoscaling/v2",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        (*APPLY, "delete"),
        "CPU autoscaling; deleted when the spec stops asking for it",
        builders.render_hpas,
    ),
    Kind(
        "policy/v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        (*APPLY, "delete"),
        "worker disruption budget; deleted when the spec stops asking for it",
        builders.render_pdbs,
    ),
    Kind(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        "networkpolicies",
        (*APPLY, "delete"),
        "the service's only access control; deleted when the spec turns it off",
        builders.render_network_policies,
    ),
)
# Watched, never applied: a stuck pod on an old revision, or a worker that registered with
# an earlier dispatcher, is deleted so that its StatefulSet recreates it.
POD = Kind("v1", "Pod", "pods", ("delete",), "replace stuck and stale pods")
OBSERVED: tuple[Kind, ...] = (*CHILDREN, POD)

# Read (never watched) for a pod that is not Ready, and a lost dispatcher's journal (spec.nodeLoss,
# plan/nodeloss.py): whether its node is unreachable, and whether its journal's volume is reachable
# only from that node, in which case the claim is deleted for the StatefulSet to make a new one.
NODE = Kind("v1", "Node", "nodes", ("get",), "whether an unready pod's node is unreachable (spec.nodeLoss)")
PERSISTENT_VOLUME = Kind(
    "v1",
    "PersistentVolume",
    "persistentvolumes",
    ("get", "patch"),
    "whether a lost dispatcher's journal is node-local; if so, set to Retain before its claim is let go",
)
CLAIM = Kind(
    "v1",
    "PersistentVolumeClaim",
    "persistentvolumeclaims",
    ("get", "delete"),
    "a lost dispatcher's journal claim: its volume; deleted when only the lost node reaches it",
)
NODE_LOSS_READS: tuple[Kind, ...] = (NODE, PERSISTENT_VOLUME, CLAIM)
TFDATASERVICE = Kind(API_VERSION, KIND, PLURAL, (), "the resource itself")
# spec.lifecycle (plan/lifecycle.py): the workload a service follows, read by name (a GET per check,
# no watch). Other kinds work too once the chart's lifecycle.workloadKinds grants get on them.
WORKLOADS: tuple[Kind, ...] = (
    Kind("batch/v1", "Job", "jobs", ("get",), "whether the Job a service follows finished (spec.lifecycle)"),
    Kind(
        "jobset.x-k8s.io/v1alpha2",
        "JobSet",
        "jobsets",
        ("get",),
        "whether the JobSet a service follows finished (spec.lifecycle)",
    ),
)
# What spec.lifecycle does to the service itself: suspend it (spec.suspend), tie it to its workload
# (metadata.ownerReferences), both a merge patch; and delete it (afterWorkloadFinishes Delete).
LIFECYCLE_VERBS = ("patch", "delete")
# Only with leader election (several replicas), only in the operator's own namespace: read, create
# and renew the Lease the replicas elect on (election.py).
LEASE = Kind("coordination.k8s.io/v1", "Lease", "leases", ("get", "create", "update"), "leader election")
# Watched (list, watch); its status written, and its finalizer added and removed (patch).
TFDATASNAPSHOT = Kind(
    API_VERSION,
    SNAPSHOT_KIND,
    SNAPSHOT_PLURAL,
    ("patch",),
    "a snapshot's progress; its finalizer (deletionPolicy Delete)",
)
# With --kueue (plan/kueue.py): the Kueue Workload of each queued service, written by server-side
# apply, deleted when the service is suspended or leaves the queue, watched (labelled as the
# children, outside kopf's indexes); its status patched to release an evicted Workload's quota and to
# say its pods are Ready. At cluster scope, read by name: the admitted ResourceFlavors (their node
# labels and tolerations go into the pods) and a service's WorkloadPriorityClass (its value).
WORKLOAD = Kind(
    kueue.WORKLOAD_API_VERSION,
    kueue.WORKLOAD_KIND,
    kueue.WORKLOAD_PLURAL,
    (*APPLY, "delete"),
    "a queued service's Kueue Workload (--kueue)",
)
FLAVOR = Kind(
    f"{kueue.GROUP}/v1beta2", kueue.FLAVOR_KIND, kueue.FLAVOR_PLURAL, ("get",), "an admitted Workload's flavors"
)
PRIORITY_CLASS = Kind(
    f"{kueue.GROUP}/v1beta2",
    kueue.PRIORITY_CLASS_KIND,
    kueue.PRIORITY_CLASS_PLURAL,
    ("get",),
    "a queued service's priority (its label kueue.x-k8s.io/priority-class)",
)
BY_KIND: dict[str, Kind] = {
    k.kind: k
    for k in (
        *OBSERVED,
        *NODE_LOSS_READS,
        TFDATASERVICE,
        TFDATASNAPSHOT,
        LEASE,
        *WORKLOADS,
        WORKLOAD,
        FLAVOR,
        PRIORITY_CLASS,
    )
}
# Kinds without a namespace (their objects' paths have none).
CLUSTER_SCOPED: tuple[Kind, ...] = (NODE, PERSISTENT_VOLUME, FLAVOR, PRIORITY_CLASS)
EVENT = Kind(
    "v1",
    "Event",
    "events",
    ("create", "patch", "list"),
    "what the operator did and why (patch: the same Event again counts up); why a child of a service is not ready",
)


def render_all(svc: ServiceSpec, settings: BuildSettings, counts: Counts) -> list[tuple[Kind, Named]]:
    """Every child of ``svc`` by kind, in the order a reconcile applies them (None: not wanted)."""
    return [
        (kind, named) for kind in CHILDREN if kind.render is not None for named in kind.render(svc, settings, counts)
    ]


def path(api_version: str, kind: str, namespace: str | None, name: str | None = None, subresource: str = "") -> str:
    """The API path of an object (or of its collection when ``name`` is None); ``namespace`` is
    None for a kind without namespaces."""
    plural = EVENT.plural if kind == EVENT.kind else plural_of(kind)
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    result = f"{prefix}/{plural}" if namespace is None else f"{prefix}/namespaces/{namespace}/{plural}"
    if name:
        result += f"/{name}"
    if subresource:
        result += f"/{subresource}"
    return result


def plural_of(kind: str) -> str:
    """The resource name of a kind: the table's; for a kind it does not list (a workload of
    spec.lifecycle), as Kubernetes' code generators and kubebuilder derive it (lowercase; -es after
    s, x, ch, sh; consonant+y to -ies; else -s)."""
    if kind in BY_KIND:
        return BY_KIND[kind].plural
    lower = kind.lower()
    if lower.endswith(("s", "x", "ch", "sh")):
        return lower + "es"
    if lower.endswith("y") and lower[-2:-1] not in tuple("aeiou"):
        return lower[:-1] + "ies"
    return lower + "s"


Rule = tuple[str, str, str]  # API group, resource (or resource/subresource), verb


def namespaced_rules() -> set[Rule]:
    """Every (group, resource, verb) the operator uses in a namespace it watches."""
    rules: set[Rule] = set()
    for kind in OBSERVED:
        rules |= {(kind.group, kind.plural, verb) for verb in ("list", "watch", *kind.verbs)}
    rules |= {(API_GROUP, PLURAL, verb) for verb in ("list", "watch")}
    rules.add((API_GROUP, f"{PLURAL}/status", "patch"))
    # The TFData autoscaler sets the worker count where `kubectl scale` does.
    rules.add((API_GROUP, f"{PLURAL}/scale", "patch"))
    # ownerReferences with blockOwnerDeletion need it where OwnerReferencesPermissionEnforcement runs.
    rules.add((API_GROUP, f"{PLURAL}/finalizers", "update"))
    snapshots = TFDATASNAPSHOT
    rules |= {(snapshots.group, snapshots.plural, verb) for verb in ("list", "watch", *snapshots.verbs)}
    rules.add((snapshots.group, f"{snapshots.plural}/status", "patch"))
    rules |= {(EVENT.group, EVENT.plural, verb) for verb in EVENT.verbs}
    rules |= {(CLAIM.group, CLAIM.plural, verb) for verb in CLAIM.verbs}
    rules |= {(API_GROUP, PLURAL, verb) for verb in LIFECYCLE_VERBS}
    rules |= {(kind.group, kind.plural, verb) for kind in WORKLOADS for verb in kind.verbs}
    return rules


def cluster_rules() -> set[Rule]:
    """What the operator reads at cluster scope, wherever it watches: the Nodes and volumes of spec.nodeLoss."""
    return {(kind.group, kind.plural, verb) for kind in (NODE, PERSISTENT_VOLUME) for verb in kind.verbs}


def kueue_rules() -> tuple[set[Rule], set[Rule]]:
    """With --kueue (the chart's kueue.enabled): what the operator does with Workloads in a namespace it
    watches, and what it reads at cluster scope (flavors, priority classes)."""
    namespaced = {(WORKLOAD.group, WORKLOAD.plural, verb) for verb in ("list", "watch", *WORKLOAD.verbs)}
    namespaced.add((WORKLOAD.group, f"{WORKLOAD.plural}/status", "patch"))
    cluster = {(kind.group, kind.plural, verb) for kind in (FLAVOR, PRIORITY_CLASS) for verb in kind.verbs}
    return namespaced, cluster


def leader_election_rules() -> set[Rule]:
    """What the operator uses in the Lease's namespace when replicas elect a leader."""
    return {(LEASE.group, LEASE.plural, verb) for verb in LEASE.verbs}
