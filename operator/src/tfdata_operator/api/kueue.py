"""Kueue's names, as the operator reads and writes them (Kueue v0.19, ``kueue.x-k8s.io/v1beta2``).

A TFDataService labelled ``kueue.x-k8s.io/queue-name`` is admitted through Kueue as one
Workload the operator writes (``render/workload.py``, decided by ``plan/kueue.py``): pod sets
``dispatcher`` (1) and ``workers``; no pod runs until Kueue admits it. Kueue's own labels are
never copied onto the children: on a StatefulSet they would start Kueue's StatefulSet
integration, which freezes its replicas and pod template.
"""

from __future__ import annotations

GROUP = "kueue.x-k8s.io"
WORKLOAD_API_VERSION = f"{GROUP}/v1beta2"
WORKLOAD_KIND = "Workload"
WORKLOAD_PLURAL = "workloads"
FLAVOR_KIND = "ResourceFlavor"
FLAVOR_PLURAL = "resourceflavors"
PRIORITY_CLASS_KIND = "WorkloadPriorityClass"
PRIORITY_CLASS_PLURAL = "workloadpriorityclasses"

# On a TFDataService: the LocalQueue it is admitted through, and its WorkloadPriorityClass.
QUEUE_LABEL = f"{GROUP}/queue-name"
PRIORITY_LABEL = f"{GROUP}/priority-class"
# Kueue's label and annotation keys, refused in spec.<component>.labels (see above).
PREFIX = f"{GROUP}/"
# The value of integrations.externalFrameworks that makes a TFDataService a kind Kueue knows.
FRAMEWORK = "TFDataService.v1alpha1.tfdata.dev"

# The Workload's pod sets.
DISPATCHER_POD_SET, WORKERS_POD_SET = "dispatcher", "workers"

# The Workload's condition types Kueue writes (workload_types.go) and the one the owner writes.
QUOTA_RESERVED, ADMITTED, EVICTED, PREEMPTED, REQUEUED, FINISHED, PODS_READY = (
    "QuotaReserved",
    "Admitted",
    "Evicted",
    "Preempted",
    "Requeued",
    "Finished",
    "PodsReady",
)
# PodsReady's reasons (workload_types.go): not Ready yet since the admission; Ready; not Ready after
# having been; Ready again.
WAIT_FOR_START, STARTED, WAIT_FOR_RECOVERY, RECOVERED = "WaitForStart", "Started", "WaitForRecovery", "Recovered"
# Evictions after which Kueue queues the Workload again at once (Requeued True); after the
# others it waits for what evicted it to change (a ClusterQueue started again, say).
REQUEUED_AFTER = ("Preempted", "NodeFailures")
