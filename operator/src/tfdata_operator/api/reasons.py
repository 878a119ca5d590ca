"""Every condition type, condition reason and Event reason the operator writes, in one place.

A TFDataService's ``status.conditions`` follow ``metav1.Condition``: ``Ready`` sums up the
others. Where Kubernetes itself says why a pod does not run (``CrashLoopBackOff``,
``ImagePullBackOff``, ``Unschedulable``, ``FailedCreate``, ...), a condition carries that reason
as it is; the reasons below are the operator's own.
"""

from __future__ import annotations

# --- Condition types ---------------------------------------------------------------------
READY = "Ready"
DISPATCHER_READY = "DispatcherReady"
WORKERS_READY = "WorkersReady"
# Present once the service was suspended (as with Kubernetes Jobs): True while suspended.
SUSPENDED = "Suspended"
CONDITION_TYPES = (READY, DISPATCHER_READY, WORKERS_READY, SUSPENDED)

# --- Condition reasons -------------------------------------------------------------------
DISPATCHER_MISSING = "DispatcherMissing"
DISPATCHER_SERVING = "DispatcherReady"
DISPATCHER_NOT_READY = "DispatcherNotReady"
DISPATCHER_RESTARTING = "DispatcherRestarting"
WORKERS_MISSING = "WorkersMissing"
WORKERS_SERVING = "WorkersReady"
WORKERS_NOT_READY = "WorkersNotReady"
# spec.autoscaling.minReplicas 0 and nobody reads: no worker runs, and the service is Ready.
SCALED_TO_ZERO = "ScaledToZero"
# Ready=False, and a Warning Event of the same reason, once: nothing is changed.
INVALID_SPEC = "InvalidSpec"
NAME_CONFLICT = "NameConflict"
# spec.snapshots.directory is another TFDataService's, or nested with it (plan/snapshotdir.py): the same.
SNAPSHOT_DIRECTORY_TAKEN = "SnapshotDirectoryTaken"
# Another admission controller of the cluster (a webhook, a ValidatingAdmissionPolicy) refused a child
# (plan/admission.py): the same, and tried again with the work queue's back-off, as it is no spec error.
CHILD_REFUSED_BY_ADMISSION = "ChildRefusedByAdmission"
# A ResourceQuota of the namespace has no room for a child (plan/admission.py): the same, and tried again
# with back-off too, as the quota may be raised or what else uses it deleted.
QUOTA_EXCEEDED = "QuotaExceeded"
# A rescale or a suspend waits for the readers (spec.workers.rescalePolicy WhenIdle).
RESCALE_HELD = "RescaleHeld"
SUSPEND_HELD = "SuspendHeld"
RESUMED = "Resumed"
# Explanations of a StatefulSet that does not serve, where Kubernetes gives no reason of its own.
CLAIM_PENDING = "ClaimPending"
SERVER_NOT_READY = "ServerNotReady"
# spec.image cannot run the server program: no python3, a Python or TensorFlow too old.
UNSUPPORTED_IMAGE = "UnsupportedImage"
# A pod's node is unreachable (spec.nodeLoss): replaced once replaceAfterSeconds have passed; or,
# with spec.nodeLoss.dispatcher Wait, the dispatcher's, left for a person.
NODE_UNREACHABLE = "NodeUnreachable"
# A worker whose node is unreachable past replaceAfterSeconds, kept while a snapshot is written (a
# replacement would be a second writer of its stream): it goes once the node is known to be off. The
# condition's reason, and a Warning Event of the same reason, once.
KEPT_FOR_SNAPSHOT = "KeptForSnapshot"
DISPATCHER_NODE_LOST = "DispatcherNodeLost"
# Kubernetes' own, used when its object names none.
FAILED_CREATE = "FailedCreate"
UNSCHEDULABLE = "Unschedulable"

# --- Event reasons (besides the refusals above, RESCALE_HELD and SUSPEND_HELD) ---------------------
CREATED = "Created"
UPDATED = "Updated"
ROLLING_OUT = "RollingOut"
# A StatefulSet's replicas changed; the TFData autoscaler's change of the worker count too.
SCALED = "Scaled"
DELETED = "Deleted"
RECREATING = "Recreating"
RESTARTED_STUCK_POD = "RestartedStuckPod"
RESTARTED_STALE_WORKER = "RestartedStaleWorker"
# A pod on a node unreachable for spec.nodeLoss.replaceAfterSeconds, force-deleted; a dispatcher whose
# journal's volume only that node reaches also loses its claim, and with it the running jobs (Warning).
REPLACED_LOST_POD = "ReplacedLostPod"
JOURNAL_LOST = "JournalLost"
HELD_CHANGE_FORCED = "HeldChangeForced"
HELD_CHANGE_CARRIED_OUT = "HeldChangeCarriedOut"
SUSPENDING = "Suspending"
# The workers' PodDisruptionBudget changed (plan/drain.py): drains wait while a client reads a
# static service, go ahead once nobody reads, or go ahead after rescaleMaxWaitSeconds although one does.
DRAINS_HELD = "DrainsHeld"
DRAINS_ALLOWED = "DrainsAllowed"
DRAINS_FORCED = "DrainsForced"
# Events recorded as Warnings: a person may want to act on them.
WARNINGS = frozenset({DRAINS_FORCED})
RESUMING = "Resuming"
# spec.lifecycle (plan/lifecycle.py): the workload finished (and what will happen when), cannot be
# found or read (nothing is done), and the service suspended or deleted by a lifecycle rule.
WORKLOAD_FINISHED = "WorkloadFinished"
WORKLOAD_NOT_FOUND = "WorkloadNotFound"
WORKLOAD_UNREADABLE = "WorkloadUnreadable"
LIFECYCLE_SUSPEND = "LifecycleSuspend"
LIFECYCLE_DELETE = "LifecycleDelete"
# Kueue (plan/kueue.py): the service's Workload queued, admitted, evicted (Warning), going through the
# queue again after an edit of what Kueue accounts for, finished by Kueue (Warning), not writable or its
# flavors not readable (Warning), and deleted when the service's queue label was removed. While no pod
# may run, Ready is False with the first five as its reason.
KUEUE_QUEUED = "KueueQueued"
KUEUE_ADMITTED = "KueueAdmitted"
KUEUE_EVICTED = "KueueEvicted"
KUEUE_REQUEUEING = "KueueRequeueing"
KUEUE_FINISHED = "KueueFinished"
KUEUE_UNAVAILABLE = "KueueUnavailable"
KUEUE_LEFT = "KueueLeft"
