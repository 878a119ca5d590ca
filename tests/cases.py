"""Inputs shared by several test tiers, so the schema and the operator are held to one table."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from support import Kubectl, wait_for

from tfdata_operator import __version__, cli
from tfdata_operator.api import spec
from tfdata_operator.api.identity import KIND
from tfdata_operator.render.builders import BuildSettings
from tfdata_operator.wire.signals import JobReading, ServiceSignals

import devcluster
from fixtures.manifests import API_VERSION

ROOT = Path(__file__).resolve().parents[1]
CRD_PATH = ROOT / "crds" / "tfdata.dev_tfdataservices.yaml"
SNAPSHOT_CRD_PATH = ROOT / "crds" / "tfdata.dev_tfdatasnapshots.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
IMAGE = "tfdata-server:test"


# A dispatcher's /v1/signals while a reporting trainer waits on two saturated workers.
STALLED_SIGNALS = ServiceSignals(
    reading=True,
    reasons=("a worker holds a task",),
    idle_seconds=0.0,
    registered_workers=2,
    workers_answering=2,
    workers_unreachable=(),
    worker_tasks=2,
    worker_cpu_utilization_mean=0.953,
    worker_cpu_utilization_max=0.99,
    reporting_clients=1,
    client_stall_fraction_mean=0.381,
    client_stall_fraction_max=0.381,
    age_seconds=0.4,
    client_elements_per_second=61.234,
    jobs=(JobReading("train", 1, 0.381, 0.381, 61.234),),
)


def body(name: str = "demo", namespace: str = "ml", generation: int = 1, **spec_fields: Any) -> dict[str, Any]:
    """A TFDataService as the API server hands it to the operator."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-1", "generation": generation},
        "spec": spec_fields,
    }


def parse(generation: int = 1, **spec_fields: Any) -> spec.ServiceSpec:
    return spec.parse(body(generation=generation, **spec_fields), IMAGE)


@dataclass(frozen=True)
class BadSpec:
    """A TFDataService that must be refused; ``spec`` is YAML text so a bare OFF stays bare."""

    id: str
    spec: str
    api_says: str  # a fragment of the API server's refusal
    operator_says: str  # a fragment of the operator's (and render's) refusal
    name: str = "bad"


def expected_children(doc: dict[str, Any]) -> set[tuple[str, str]]:
    """(kind, name) of every child the operator creates for a new TFDataService: what `render` prints."""
    rendered = cli.render_document(doc, "test", cli.DEFAULT_SERVER_IMAGE, BuildSettings())
    return {(m["kind"], m["metadata"]["name"]) for m in rendered}


def manifest(case: BadSpec | Unready) -> str:
    body = "\n".join("  " + line for line in case.spec.strip().splitlines())
    return f"apiVersion: {API_VERSION}\nkind: TFDataService\nmetadata:\n  name: {case.name}\nspec:\n{body}\n"


BAD_SPECS = [
    BadSpec(
        "preload-not-a-module",
        "preload: {modules: [tensorflow-text]}",
        "should match",
        "must be a Python module name such as tensorflow_text",
    ),
    BadSpec("preload-relative-library", "preload: {opLibraries: [ops.so]}", "should match", "must be an absolute path"),
    BadSpec("unknown-server-program", "serverProgram: Mine", 'Unsupported value: "Mine"', "must be one of"),
    BadSpec("unknown-policy", "shardingPolicy: RANDOM", 'Unsupported value: "RANDOM"', "must be one of"),
    BadSpec("bare-OFF", "shardingPolicy: OFF", "must be of type string", 'write "OFF" in quotes'),
    BadSpec(
        "cross-trainer-cache-without-memory",
        "workers: {crossTrainerCacheSize: 2Gi}",
        "spec.workers.crossTrainerCacheSize needs a memory limit for the workers",
        "spec.workers.crossTrainerCacheSize (2Gi) needs a memory limit for the workers",
    ),
    BadSpec(
        "cross-trainer-cache-above-memory",
        "workers: {crossTrainerCacheSize: 2Gi, resources: {limits: {memory: 2Gi}}}",
        "spec.workers.crossTrainerCacheSize does not fit in the workers' memory",
        "spec.workers.crossTrainerCacheSize (2Gi) does not fit in the workers' memory",
    ),
    BadSpec(
        "cross-trainer-cache-too-small",
        "workers: {crossTrainerCacheSize: 512Ki, resources: {limits: {memory: 2Gi}}}",
        "crossTrainerCacheSize must be a quantity from 1Mi to 1Ti",
        "spec.workers.crossTrainerCacheSize must be between 1Mi and 1Ti, got 512Ki",
    ),
    BadSpec(
        "zero-replicas",
        "workers: {replicas: 0}",
        "spec.workers.replicas 0 is allowed only with spec.autoscaling.minReplicas 0",
        "spec.workers.replicas 0 is allowed only with spec.autoscaling.minReplicas 0 (scale to zero): set 1 or more, "
        "or set spec.suspend: true",
    ),
    BadSpec("negative-replicas", "workers: {replicas: -3}", "greater than or equal to 0", "got -3"),
    BadSpec(
        "scale-to-zero-with-cpu",
        "shardingPolicy: DYNAMIC\nworkers: {resources: {requests: {cpu: 100m}}}\n"
        "autoscaling: {metric: CPU, minReplicas: 0, maxReplicas: 4}",
        "minReplicas 0 (scale to zero) needs metric TFData",
        "minReplicas 0 (scale to zero) needs metric TFData",
    ),
    BadSpec(
        "scale-to-zero-without-journal",
        "shardingPolicy: DYNAMIC\ndispatcher: {faultTolerantMode: false}\n"
        "autoscaling: {minReplicas: 0, maxReplicas: 4}",
        "minReplicas 0 (scale to zero) needs spec.dispatcher.faultTolerantMode true",
        "minReplicas 0 (scale to zero) needs spec.dispatcher.faultTolerantMode true",
    ),
    BadSpec(
        "scale-to-zero-with-a-url-journal",
        "shardingPolicy: DYNAMIC\ndispatcher: {workDir: 'gs://bucket/journal'}\n"
        "autoscaling: {minReplicas: 0, maxReplicas: 4}",
        "minReplicas 0 (scale to zero) needs the dispatcher's journal on its pod's own file system",
        "minReplicas 0 (scale to zero) needs the dispatcher's journal on its pod's own file system",
    ),
    BadSpec(
        "tmp-size-limit-below-64Mi",
        "workers: {tmpSizeLimit: 32Mi}",
        "tmpSizeLimit must be a quantity from 64Mi to 1Ti",
        "spec.workers.tmpSizeLimit must be between 64Mi and 1Ti, got 32Mi",
    ),
    BadSpec(
        "tmp-size-limit-above-1Ti",
        "dispatcher: {tmpSizeLimit: 2Ti}",
        "tmpSizeLimit must be a quantity from 64Mi to 1Ti",
        "spec.dispatcher.tmpSizeLimit must be between 64Mi and 1Ti, got 2Ti",
    ),
    BadSpec("tmp-size-limit-not-a-quantity", "workers: {tmpSizeLimit: lots}", "should match", "must be a quantity"),
    BadSpec("replicas-as-string", 'workers: {replicas: "3"}', "must be of type integer", "must be an integer"),
    BadSpec(
        "autoscaling-with-FILE",
        "shardingPolicy: FILE\nworkers: {resources: {requests: {cpu: 100m}}}\nautoscaling: {maxReplicas: 4}",
        "allowed only with shardingPolicy DYNAMIC",
        "allowed only with shardingPolicy DYNAMIC",
    ),
    BadSpec(
        "autoscaling-min-above-max",
        "shardingPolicy: DYNAMIC\nworkers: {resources: {requests: {cpu: 100m}}}\n"
        "autoscaling: {minReplicas: 5, maxReplicas: 2}",
        "minReplicas must not exceed",
        "must not exceed maxReplicas",
    ),
    BadSpec(
        "cpu-autoscaling-without-cpu-request",
        "shardingPolicy: DYNAMIC\nautoscaling: {metric: CPU, maxReplicas: 4}",
        "needs a CPU request",
        "needs a CPU request",
    ),
    BadSpec(
        "unknown-autoscaling-metric",
        "shardingPolicy: DYNAMIC\nautoscaling: {metric: Memory, maxReplicas: 4}",
        'Unsupported value: "Memory"',
        "spec.autoscaling.metric must be one of TFData, CPU, got 'Memory'",
    ),
    BadSpec(
        "cpu-autoscaling-when-idle",
        "shardingPolicy: DYNAMIC\nworkers: {resources: {requests: {cpu: 100m}}}\n"
        "autoscaling: {metric: CPU, maxReplicas: 4, scaleDown: WhenIdle}",
        "scaleDown WhenIdle needs metric TFData",
        "scaleDown WhenIdle needs metric TFData",
    ),
    BadSpec(
        "cpu-autoscaling-with-stall-target",
        "shardingPolicy: DYNAMIC\nworkers: {resources: {requests: {cpu: 100m}}}\n"
        "autoscaling: {metric: CPU, maxReplicas: 4, targetDataStallPercentage: 20}",
        "targetDataStallPercentage is used only by metric TFData",
        "targetDataStallPercentage is used only by metric TFData",
    ),
    BadSpec(
        "unknown-scale-down-mode",
        "shardingPolicy: DYNAMIC\nautoscaling: {maxReplicas: 4, scaleDown: Never}",
        'Unsupported value: "Never"',
        "spec.autoscaling.scaleDown must be one of WhenIdle, Always, got 'Never'",
    ),
    BadSpec(
        "autoscaling-without-max",
        "shardingPolicy: DYNAMIC\nworkers: {resources: {requests: {cpu: 100m}}}\nautoscaling: {minReplicas: 2}",
        "spec.autoscaling.maxReplicas: Required value",
        "maxReplicas is required",
    ),
    BadSpec("port-out-of-range", "dispatcher: {port: 70000}", "less than or equal to 65535", "got 70000"),
    BadSpec(
        "dispatcher-port-equals-health",
        "dispatcher: {port: 8080, healthPort: 8080}",
        "spec.dispatcher.port and spec.dispatcher.healthPort must differ",
        "must differ",
    ),
    BadSpec(
        "worker-port-equals-health",
        "workers: {port: 9000, healthPort: 9000}",
        "spec.workers.port and spec.workers.healthPort must differ",
        "must differ",
    ),
    BadSpec("oversized-image", "image: " + "r/" + "x" * 600, "Too long", "1 to 512 characters"),
    BadSpec("unknown-field", "shards: 4", 'unknown field "spec.shards"', "unknown fields: shards"),
    BadSpec(
        "journal-nowhere",
        "dispatcher: {faultTolerantMode: true, storage: {enabled: false}}",
        "needs somewhere to journal",
        "needs somewhere to journal",
    ),
    BadSpec("relative-work-dir", "dispatcher: {workDir: journal}", "should match", "must be an absolute path"),
    BadSpec(
        "reserved-label",
        "workers: {labels: {app.kubernetes.io/instance: other}}",
        "must not set app.kubernetes.io/name",
        "must not set app.kubernetes.io/instance",
    ),
    BadSpec(
        "kueue-label-on-pods",
        "workers: {labels: {kueue.x-k8s.io/queue-name: team-a}}",
        "labels must not set kueue.x-k8s.io/* keys",
        "spec.workers.labels must not set kueue.x-k8s.io/queue-name",
    ),
    BadSpec("bad-storage-size", "dispatcher: {storage: {size: lots}}", "should match", "must be a quantity"),
    BadSpec("unknown-pull-policy", "imagePullPolicy: Sometimes", 'Unsupported value: "Sometimes"', "must be one of"),
    BadSpec(
        "transfer-port-without-protocol",
        "workers: {dataTransferPort: 6000}",
        "spec.workers.dataTransferPort is not used",
        "spec.workers.dataTransferPort is not used: TensorFlow 2.21 sends elements over the workers' gRPC port",
    ),
    # --- The table: wrong types inside embedded core types, and a protocol TF lacks.
    BadSpec(
        "affinity-as-number",
        "workers: {affinity: {nodeAffinity: 3}}",
        "spec.workers.affinity.nodeAffinity: Invalid value",
        "spec.workers.affinity.nodeAffinity must be an object, got the number 3",
    ),
    BadSpec(
        "peer-selector-as-number",
        "networkPolicy: {from: [{podSelector: 5}]}",
        "spec.networkPolicy.from[0].podSelector: Invalid value",
        "spec.networkPolicy.from[0].podSelector must be an object",
    ),
    BadSpec(
        "egress-except-not-a-cidr",
        "networkPolicy: {egress: {enabled: true, except: [169.254.169.254]}}",
        "must be a CIDR such as 169.254.169.254/32 or fd00:ec2::254/128",
        "spec.networkPolicy.egress.except[0] must be a CIDR such as 169.254.169.254/32",
    ),
    BadSpec(
        "egress-without-the-network-policy",
        "networkPolicy: {enabled: false, egress: {enabled: true}}",
        "spec.networkPolicy.egress.enabled needs spec.networkPolicy.enabled",
        "spec.networkPolicy.egress.enabled needs spec.networkPolicy.enabled",
    ),
    BadSpec(
        "carrier-pigeon-protocol",
        "workers: {dataTransferProtocol: carrier-pigeon}",
        'spec.workers.dataTransferProtocol: Unsupported value: "carrier-pigeon"',
        "must be one of grpc, got 'carrier-pigeon'",
    ),
    # --- Affinity (Kubernetes' own schema).
    BadSpec(
        "affinity-unknown-field",
        "workers: {affinity: {nodeAfinity: {}}}",
        'unknown field "spec.workers.affinity.nodeAfinity"',
        "spec.workers.affinity has unknown fields: nodeAfinity",
    ),
    BadSpec(
        "affinity-weight-as-string",
        "workers:\n  affinity:\n    podAntiAffinity:\n      preferredDuringSchedulingIgnoredDuringExecution:\n"
        "      - {weight: heavy, podAffinityTerm: {topologyKey: zone}}",
        "preferredDuringSchedulingIgnoredDuringExecution[0].weight: Invalid value",
        "preferredDuringSchedulingIgnoredDuringExecution[0].weight must be an integer, got 'heavy'",
    ),
    BadSpec(
        "affinity-terms-as-object",
        "dispatcher:\n  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n"
        "        nodeSelectorTerms: {key: pool}",
        # The API server decodes an object where a list belongs, then finds its keys unknown.
        'unknown field "spec.dispatcher.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution'
        '.nodeSelectorTerms.key"',
        "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms must be a list",
    ),
    BadSpec(
        "affinity-term-without-topology-key",
        "workers:\n  affinity:\n    podAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n"
        "      - labelSelector: {matchLabels: {app: cache}}",
        "requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey: Required value",
        "requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey is required",
    ),
    # --- Tolerations.
    BadSpec(
        "tolerations-as-object",
        "workers: {tolerations: {key: gpu}}",
        'unknown field "spec.workers.tolerations.key"',
        "spec.workers.tolerations must be a list",
    ),
    BadSpec(
        "toleration-seconds-as-string",
        "workers: {tolerations: [{key: gpu, operator: Exists, effect: NoExecute, tolerationSeconds: soon}]}",
        "spec.workers.tolerations[0].tolerationSeconds: Invalid value",
        "spec.workers.tolerations[0].tolerationSeconds must be an integer, got 'soon'",
    ),
    BadSpec(
        "toleration-unknown-operator",
        "dispatcher: {tolerations: [{key: gpu, operator: Maybe}]}",
        'spec.dispatcher.tolerations[0].operator: Unsupported value: "Maybe"',
        "spec.dispatcher.tolerations[0].operator must be one of Equal, Exists, got 'Maybe'",
    ),
    # --- Resources.
    BadSpec(
        "requests-as-list",
        "workers: {resources: {requests: [cpu]}}",
        "spec.workers.resources.requests: Invalid value",
        "spec.workers.resources.requests must be a map",
    ),
    BadSpec(
        "limit-not-a-quantity",
        "dispatcher: {resources: {limits: {memory: lots}}}",
        "spec.dispatcher.resources.limits.memory",
        "spec.dispatcher.resources.limits.memory must be a quantity",
    ),
    BadSpec(
        "resource-claims",
        "workers: {resources: {claims: [{name: gpu}]}}",
        'unknown field "spec.workers.resources.claims"',
        "spec.workers.resources has unknown fields: claims",
    ),
    # --- Topology spread.
    BadSpec(
        "spread-skew-as-string",
        "workers: {topologySpreadConstraints: [{maxSkew: one, topologyKey: zone, whenUnsatisfiable: DoNotSchedule}]}",
        "spec.workers.topologySpreadConstraints[0].maxSkew: Invalid value",
        "spec.workers.topologySpreadConstraints[0].maxSkew must be an integer, got 'one'",
    ),
    BadSpec(
        "spread-without-when-unsatisfiable",
        "workers: {topologySpreadConstraints: [{maxSkew: 1, topologyKey: zone}]}",
        "spec.workers.topologySpreadConstraints[0].whenUnsatisfiable: Required value",
        "spec.workers.topologySpreadConstraints[0].whenUnsatisfiable is required",
    ),
    # --- NetworkPolicy peers.
    BadSpec(
        "peer-cidr-as-number",
        "networkPolicy: {from: [{ipBlock: {cidr: 10}}]}",
        "spec.networkPolicy.from[0].ipBlock.cidr: Invalid value",
        "spec.networkPolicy.from[0].ipBlock.cidr must be a string, got the number 10",
    ),
    BadSpec(
        "peer-label-as-list",
        "networkPolicy: {from: [{namespaceSelector: {matchLabels: {team: [a, b]}}}]}",
        "spec.networkPolicy.from[0].namespaceSelector.matchLabels.team: Invalid value",
        "spec.networkPolicy.from[0].namespaceSelector.matchLabels.team must be a string, got a list",
    ),
    BadSpec(
        "peers-as-object",
        "networkPolicy: {from: {podSelector: {}}}",
        'unknown field "spec.networkPolicy.from.podSelector"',
        "spec.networkPolicy.from must be a list",
    ),
    # --- Labels and node selectors.
    BadSpec(
        "label-value-with-space",
        'workers: {labels: {team: "ml team"}}',
        "spec.workers.labels.team in body should match",
        "spec.workers.labels has invalid values for team",
    ),
    BadSpec(
        "label-key-with-space",
        'dispatcher: {labels: {"my team": ml}}',
        "label keys must be an optional DNS prefix",
        "spec.dispatcher.labels has invalid label keys: my team",
    ),
    BadSpec(
        "node-selector-value-64",
        "workers: {nodeSelector: {pool: " + "p" * 64 + "}}",
        "spec.workers.nodeSelector.pool: Too long",
        "values must be strings of at most 63 characters",
    ),
    # --- TensorFlow's own vocabulary.
    BadSpec(
        "transfer-port-with-grpc",
        "workers: {dataTransferProtocol: grpc, dataTransferPort: 6000}",
        "spec.workers.dataTransferPort is not used",
        "remove dataTransferPort",
    ),
    BadSpec("ram-work-dir", "dispatcher: {workDir: ram://journal}", "should match", "a file or gs URL"),
    # --- Held changes.
    BadSpec(
        "max-wait-with-immediate",
        "workers: {rescalePolicy: Immediate, rescaleMaxWaitSeconds: 60}",
        "rescaleMaxWaitSeconds applies only with rescalePolicy WhenIdle",
        "rescaleMaxWaitSeconds applies only with rescalePolicy WhenIdle",
    ),
    # --- Snapshots.
    BadSpec(
        "snapshots-without-journal",
        "dispatcher: {faultTolerantMode: false}\nsnapshots: {directory: gs://bucket/tfdata}",
        "spec.snapshots needs spec.dispatcher.faultTolerantMode true",
        "spec.snapshots needs spec.dispatcher.faultTolerantMode true: TensorFlow refuses a snapshot",
    ),
    BadSpec(
        "journal-inside-snapshots",
        "dispatcher: {workDir: gs://bucket/tfdata/journal}\nsnapshots: {directory: gs://bucket/tfdata}",
        "the dispatcher's journal (spec.dispatcher.workDir, /var/lib/tfdata/journal by default) is inside",
        "the dispatcher's journal (gs://bucket/tfdata/journal, spec.dispatcher.workDir) is inside "
        "spec.snapshots.directory gs://bucket/tfdata, where trainers read and delete snapshots",
    ),
    BadSpec(
        "default-journal-inside-snapshots",
        "snapshots: {directory: /var/lib/}",
        "a DELETE of a snapshot there could remove the journal",
        "the dispatcher's journal (/var/lib/tfdata/journal, its default) is inside spec.snapshots.directory /var/lib/",
    ),
    BadSpec(
        "snapshots-volume-at-a-url",
        "snapshots: {directory: gs://bucket/tfdata, volume: {claimName: shared}}",
        "spec.snapshots.volume is mounted at spec.snapshots.directory, so the directory must be an absolute path",
        "spec.snapshots.volume is mounted at spec.snapshots.directory, so the directory must be an absolute path",
    ),
    BadSpec(
        "snapshots-relative-directory",
        "snapshots: {directory: data/snapshots}",
        "should match",
        "spec.snapshots.directory must be an absolute path or a URL such as gs://bucket/path, got 'data/snapshots'",
    ),
    BadSpec(
        "snapshots-volume-over-tmp",
        "snapshots: {directory: /tmp, volume: {claimName: shared}}",
        "spec.snapshots.directory must not be /, /tmp or /var/lib/tfdata",
        "spec.snapshots.directory must not be /tmp when a volume is mounted there",
    ),
    BadSpec(
        "snapshots-without-directory",
        "snapshots: {volume: {claimName: shared}}",
        "spec.snapshots.directory: Required value",
        "spec.snapshots.directory is required",
    ),
    BadSpec(
        "snapshots-bad-claim-name",
        "snapshots: {directory: /snapshots, volume: {claimName: Shared_Data}}",
        "should match",
        "spec.snapshots.volume.claimName has an invalid value 'Shared_Data'",
    ),
    BadSpec(
        "snapshots-unknown-field",
        "snapshots: {dir: /snapshots, directory: /snapshots}",
        'unknown field "spec.snapshots.dir"',
        "spec.snapshots has unknown fields: dir",
    ),
    BadSpec(
        "snapshots-mount-taken",
        "snapshots: {directory: /snapshots, volume: {claimName: shared}}\n"
        "workers: {volumes: [{name: data, emptyDir: {}}], volumeMounts: [{name: data, mountPath: /snapshots}]}",
        "spec.dispatcher.volumeMounts and spec.workers.volumeMounts must not mount at spec.snapshots.directory",
        "spec.workers.volumeMounts[0].mountPath must not be /snapshots: the operator mounts its own snapshots volume",
    ),
    BadSpec(
        "snapshots-volume-name-taken",
        "snapshots: {directory: /snapshots, volume: {claimName: shared}}\n"
        "dispatcher: {volumes: [{name: snapshots, emptyDir: {}}]}",
        "spec.dispatcher.volumes and spec.workers.volumes must not use the name snapshots",
        "spec.dispatcher.volumes must not use the name snapshots: the operator adds its own snapshots volume",
    ),
    # --- Node loss.
    BadSpec(
        "unknown-node-loss-dispatcher", "nodeLoss: {dispatcher: Later}", 'Unsupported value: "Later"', "must be one of"
    ),
    BadSpec(
        "negative-replace-after",
        "nodeLoss: {replaceAfterSeconds: -1}",
        "greater than or equal to 30",
        "spec.nodeLoss.replaceAfterSeconds must be between 0 and 86400, got -1",
    ),
    BadSpec(
        "dispatcher-replaced-sooner-than-30-s",
        "nodeLoss: {dispatcherReplaceAfterSeconds: 10}",
        "greater than or equal to 30",
        "spec.nodeLoss.dispatcherReplaceAfterSeconds must be between 30 and 86400, got 10",
    ),
    BadSpec(
        "fenced-by-on-two-lines",
        'nodeLoss: {fencedBy: "our agent\\nrm -rf"}',
        "spec.nodeLoss.fencedBy in body should match",
        "it must be one line of text, without control characters",
    ),
    BadSpec(
        "node-loss-unknown-field",
        "nodeLoss: {replaceAfter: 60}",
        'unknown field "spec.nodeLoss.replaceAfter"',
        "spec.nodeLoss has unknown fields: replaceAfter",
    ),
    # --- Lifecycle.
    BadSpec(
        "lifecycle-without-workload",
        "lifecycle: {afterWorkloadFinishes: {action: Delete}}",
        "spec.lifecycle.afterWorkloadFinishes needs spec.lifecycle.workload",
        "spec.lifecycle.afterWorkloadFinishes needs spec.lifecycle.workload: name the Job",
    ),
    BadSpec(
        "lifecycle-unknown-action",
        "lifecycle: {workload: {apiVersion: batch/v1, kind: Job, name: t}, afterWorkloadFinishes: {action: Stop}}",
        'Unsupported value: "Stop"',
        "must be one of",
    ),
    BadSpec(
        "lifecycle-idle-without-seconds",
        "lifecycle: {idle: {}}",
        "spec.lifecycle.idle.suspendAfterSeconds: Required value",
        "spec.lifecycle.idle.suspendAfterSeconds is required",
    ),
    BadSpec(
        "lifecycle-workload-lowercase-kind",
        "lifecycle: {workload: {apiVersion: batch/v1, kind: job, name: t}}",
        "spec.lifecycle.workload.kind in body should match",
        "spec.lifecycle.workload.kind has an invalid value 'job': it must be a kind as Kubernetes spells it",
    ),
    BadSpec(
        "unknown-rescale-policy", "workers: {rescalePolicy: Later}", 'Unsupported value: "Later"', "must be one of"
    ),
    BadSpec("suspend-as-string", 'suspend: "yes"', "spec.suspend: Invalid value", "must be true or false"),
    BadSpec("lowercase-policy", "shardingPolicy: dynamic", 'Unsupported value: "dynamic"', "must be one of"),
    # --- Other wrong types.
    BadSpec(
        "fault-tolerance-as-string",
        'dispatcher: {faultTolerantMode: "true"}',
        "spec.dispatcher.faultTolerantMode: Invalid value",
        "must be true or false, got 'true'",
    ),
    BadSpec("workers-as-list", "workers: [a]", "spec.workers: Invalid value", "spec.workers must be an object"),
    BadSpec(
        "pull-secret-without-name",
        "imagePullSecrets: [{}]",
        "spec.imagePullSecrets[0].name: Required value",
        "spec.imagePullSecrets[0] must be an object with a non-empty name",
    ),
    BadSpec(
        "zero-cpu-target",
        "shardingPolicy: DYNAMIC\nworkers: {resources: {requests: {cpu: 100m}}}\n"
        "autoscaling: {maxReplicas: 4, targetCPUUtilizationPercentage: 0}",
        "greater than or equal to 1",
        "targetCPUUtilizationPercentage must be between 1 and 100, got 0",
    ),
    # --- Names at their length limits (what Kubernetes derives from them must fit too).
    BadSpec(
        "name-too-long",
        "shardingPolicy: DYNAMIC",
        "metadata.name must be at most 41 characters",
        "at most 41 characters",
        name="n" * 42,
    ),
    BadSpec(
        "name-starting-with-digit",
        "shardingPolicy: DYNAMIC",
        "metadata.name must start with a letter",
        "starting with a letter",
        name="1st-service",
    ),
    BadSpec(
        "priority-class-not-a-name",
        "workers: {priorityClassName: Not_A_Name}",
        "spec.workers.priorityClassName in body should match",
        "priorityClassName has an invalid value 'Not_A_Name'",
    ),
    BadSpec(
        "service-account-254",
        "dispatcher: {serviceAccountName: " + "s" * 254 + "}",
        "spec.dispatcher.serviceAccountName: Too long",
        "1 to 253 characters long, got 254",
    ),
    BadSpec(
        "storage-class-not-a-name",
        "dispatcher: {storage: {storageClassName: Fast SSD}}",
        "spec.dispatcher.storage.storageClassName in body should match",
        "storageClassName has an invalid value",
    ),
    BadSpec(
        "label-value-64",
        "workers: {labels: {team: " + "t" * 64 + "}}",
        "spec.workers.labels.team: Too long",
        "values must be strings of at most 63 characters",
    ),
    BadSpec(
        "annotation-4097",
        "workers: {annotations: {note: " + "a" * 4097 + "}}",
        "spec.workers.annotations.note: Too long",
        "values must be strings of at most 4096 characters",
    ),
    # --- Volumes, volume mounts and environment variables (Kubernetes' own schemas, and the operator's names).
    BadSpec(
        "volume-nfs-read-only-as-string",
        'workers: {volumes: [{name: data, nfs: {server: nfs.example, path: /exports, readOnly: "yes"}}]}',
        "spec.workers.volumes[0].nfs.readOnly: Invalid value",
        "spec.workers.volumes[0].nfs.readOnly must be a boolean, got 'yes'",
    ),
    BadSpec(
        "volume-claim-name-as-number",
        "workers: {volumes: [{name: data, persistentVolumeClaim: {claimName: 7}}]}",
        "spec.workers.volumes[0].persistentVolumeClaim.claimName: Invalid value",
        "spec.workers.volumes[0].persistentVolumeClaim.claimName must be a string, got the number 7",
    ),
    BadSpec(
        "volume-secret-items-as-object",
        "workers: {volumes: [{name: creds, secret: {secretName: gcs, items: {key: token}}}]}",
        'unknown field "spec.workers.volumes[0].secret.items.key"',
        "spec.workers.volumes[0].secret.items must be a list",
    ),
    BadSpec(
        "volume-csi-attributes-as-list",
        "workers: {volumes: [{name: bucket, csi: {driver: gcsfuse.csi.storage.gke.io, volumeAttributes: [a]}}]}",
        "spec.workers.volumes[0].csi.volumeAttributes: Invalid value",
        "spec.workers.volumes[0].csi.volumeAttributes must be an object, got a list",
    ),
    BadSpec(
        "volume-source-left-out",
        "workers: {volumes: [{name: data, awsElasticBlockStore: {volumeID: vol-1}}]}",
        'unknown field "spec.workers.volumes[0].awsElasticBlockStore"',
        "spec.workers.volumes[0] has unknown fields: awsElasticBlockStore",
    ),
    BadSpec(
        "volume-ephemeral-left-out",
        "workers: {volumes: [{name: scratch, ephemeral: {}}]}",
        'unknown field "spec.workers.volumes[0].ephemeral"',
        "spec.workers.volumes[0] has unknown fields: ephemeral",
    ),
    BadSpec(
        "volume-without-source",
        "workers: {volumes: [{name: data}]}",
        "a volume must set exactly one source",
        "spec.workers.volumes[0] must set exactly one source of",
    ),
    BadSpec(
        "volume-with-two-sources",
        "dispatcher: {volumes: [{name: data, emptyDir: {}, secret: {secretName: gcs}}]}",
        "a volume must set exactly one source",
        "spec.dispatcher.volumes[0] must set exactly one source of configMap, csi, emptyDir, hostPath, nfs, "
        "persistentVolumeClaim, secret, got emptyDir, secret",
    ),
    BadSpec(
        "volume-name-not-a-dns-label",
        "workers: {volumes: [{name: Training_Data, emptyDir: {}}]}",
        "a volume's name must be at most 63 lowercase letters",
        "spec.workers.volumes[0].name 'Training_Data' must be at most 63 lowercase letters",
    ),
    BadSpec(
        "volume-name-twice",
        "workers: {volumes: [{name: data, emptyDir: {}}, {name: data, nfs: {server: nfs.example, path: /x}}]}",
        "spec.workers.volumes[1]: Duplicate value",
        "spec.workers.volumes has more than one item with name 'data'",
    ),
    BadSpec(
        "volume-named-tmp",
        "workers: {volumes: [{name: tmp, emptyDir: {}}]}",
        "spec.workers.volumes must not use the name tmp",
        "spec.workers.volumes must not use the name tmp: the operator adds its own tmp volume",
    ),
    BadSpec(
        "volume-named-journal",
        "dispatcher: {volumes: [{name: journal, persistentVolumeClaim: {claimName: old-journal}}]}",
        "spec.dispatcher.volumes must not use the name tmp, nor journal while spec.dispatcher.storage is enabled",
        "spec.dispatcher.volumes must not use the name journal: the operator adds its own journal volume",
    ),
    # The injected server program's volume (spec.serverProgram Injected, or Auto).
    BadSpec(
        "volume-named-like-the-injected-program",
        "serverProgram: Injected\nimage: example.com/trainer:1\n"
        "dispatcher: {volumes: [{name: tfdata-server-program, emptyDir: {}}]}",
        "must not use the name tfdata-server-program unless spec.serverProgram is FromImage",
        "spec.dispatcher.volumes must not use the name tfdata-server-program: the operator adds its own "
        "tfdata-server-program volume (mounted at /opt/tfdata). Rename the volume",
    ),
    BadSpec(
        "mount-at-the-injected-program",
        "image: example.com/trainer:1\n"
        "workers: {volumes: [{name: tools, emptyDir: {}}], volumeMounts: [{name: tools, mountPath: /opt/tfdata/}]}",
        "must not mount at or under /opt/tfdata unless spec.serverProgram is FromImage",
        "spec.workers.volumeMounts[0].mountPath must not be /opt/tfdata/: the operator mounts its own "
        "tfdata-server-program volume there",
    ),
    BadSpec(
        "mount-under-the-injected-program",
        "serverProgram: Injected\n"
        "workers: {volumes: [{name: tools, emptyDir: {}}], volumeMounts: [{name: tools, mountPath: /opt/tfdata/lib}]}",
        "must not mount at or under /opt/tfdata unless spec.serverProgram is FromImage",
        "spec.workers.volumeMounts[0].mountPath must not be under /opt/tfdata (/opt/tfdata/lib): the operator "
        "mounts the injected server program's tfdata-server-program volume there",
    ),
    BadSpec(
        "mount-read-only-as-string",
        "workers:\n  volumes: [{name: data, emptyDir: {}}]\n"
        '  volumeMounts: [{name: data, mountPath: /data, readOnly: "true"}]',
        "spec.workers.volumeMounts[0].readOnly: Invalid value",
        "spec.workers.volumeMounts[0].readOnly must be a boolean, got 'true'",
    ),
    BadSpec(
        "mount-propagation-left-out",
        "workers:\n  volumes: [{name: data, emptyDir: {}}]\n"
        "  volumeMounts: [{name: data, mountPath: /data, mountPropagation: Bidirectional}]",
        'unknown field "spec.workers.volumeMounts[0].mountPropagation"',
        "spec.workers.volumeMounts[0] has unknown fields: mountPropagation",
    ),
    BadSpec(
        "mount-of-an-undeclared-volume",
        "workers: {volumes: [{name: data, emptyDir: {}}], volumeMounts: [{name: dataset, mountPath: /data}]}",
        "every spec.workers.volumeMounts[].name must name a volume of spec.workers.volumes",
        "spec.workers.volumeMounts[0].name 'dataset' names no volume of spec.workers.volumes",
    ),
    BadSpec(
        "mount-without-volumes",
        "dispatcher: {volumeMounts: [{name: creds, mountPath: /var/run/creds}]}",
        "every spec.dispatcher.volumeMounts[].name must name a volume of spec.dispatcher.volumes",
        "spec.dispatcher.volumeMounts[0].name 'creds' names no volume of spec.dispatcher.volumes",
    ),
    BadSpec(
        "mount-of-the-operators-tmp",
        "workers: {volumeMounts: [{name: tmp, mountPath: /scratch}]}",
        "every spec.workers.volumeMounts[].name must name a volume of spec.workers.volumes",
        "spec.workers.volumeMounts[0].name 'tmp' names no volume of spec.workers.volumes",
    ),
    BadSpec(
        "mount-relative-path",
        "workers: {volumes: [{name: data, emptyDir: {}}], volumeMounts: [{name: data, mountPath: data}]}",
        "a volumeMount's mountPath must be an absolute path",
        "spec.workers.volumeMounts[0].mountPath must be an absolute path (starting with /), got 'data'",
    ),
    BadSpec(
        "mount-at-tmp",
        "workers: {volumes: [{name: scratch, emptyDir: {}}], volumeMounts: [{name: scratch, mountPath: /tmp/}]}",
        "spec.workers.volumeMounts must not mount at /tmp",
        "spec.workers.volumeMounts[0].mountPath must not be /tmp/: the operator mounts its own tmp volume there",
    ),
    BadSpec(
        "mount-at-the-journal",
        "dispatcher: {volumes: [{name: old, emptyDir: {}}], volumeMounts: [{name: old, mountPath: /var/lib/tfdata}]}",
        "spec.dispatcher.volumeMounts must not mount at /tmp, nor at /var/lib/tfdata",
        "spec.dispatcher.volumeMounts[0].mountPath must not be /var/lib/tfdata: the operator mounts its own journal",
    ),
    BadSpec(
        "mount-recursive-read-only-without-read-only",
        "workers:\n  volumes: [{name: data, emptyDir: {}}]\n"
        "  volumeMounts: [{name: data, mountPath: /data, recursiveReadOnly: Enabled}]",
        "recursiveReadOnly needs readOnly true",
        "spec.workers.volumeMounts[0].recursiveReadOnly needs readOnly: true",
    ),
    BadSpec(
        "env-value-as-number",
        "workers: {env: [{name: SHARDS, value: 4}]}",
        "spec.workers.env[0].value: Invalid value",
        "spec.workers.env[0].value must be a string, got the number 4",
    ),
    BadSpec(
        "env-secret-key-ref-without-key",
        "workers: {env: [{name: AWS_SECRET_ACCESS_KEY, valueFrom: {secretKeyRef: {name: s3}}}]}",
        "spec.workers.env[0].valueFrom.secretKeyRef.key: Required value",
        "spec.workers.env[0].valueFrom.secretKeyRef.key is required",
    ),
    BadSpec(
        "env-file-key-ref-left-out",
        "workers: {env: [{name: TOKEN, valueFrom: {fileKeyRef: {volumeName: v, path: p, key: k}}}]}",
        'unknown field "spec.workers.env[0].valueFrom.fileKeyRef"',
        "spec.workers.env[0].valueFrom has unknown fields: fileKeyRef",
    ),
    BadSpec(
        "env-sets-the-server-config",
        'workers: {env: [{name: TFDATA_SERVER_CONFIG, value: "{}"}]}',
        "env must not set TFDATA_SERVER_CONFIG, POD_NAME or POD_NAMESPACE",
        "spec.workers.env must not set TFDATA_SERVER_CONFIG: the operator sets",
    ),
    BadSpec(
        "env-sets-the-pod-name",
        "dispatcher: {env: [{name: POD_NAME, value: dispatcher-0}]}",
        "env must not set TFDATA_SERVER_CONFIG, POD_NAME or POD_NAMESPACE",
        "spec.dispatcher.env must not set POD_NAME: the operator sets",
    ),
    BadSpec(
        "env-from-as-object",
        "workers: {envFrom: {secretRef: {name: s3}}}",
        'unknown field "spec.workers.envFrom.secretRef"',
        "spec.workers.envFrom must be a list",
    ),
    BadSpec(
        "env-from-prefix-as-number",
        "workers: {envFrom: [{prefix: 3, configMapRef: {name: settings}}]}",
        "spec.workers.envFrom[0].prefix: Invalid value",
        "spec.workers.envFrom[0].prefix must be a string, got the number 3",
    ),
]

# A hostPath volume: accepted by the schema, refused by an operator without --allow-host-path-volumes.
HOST_PATH = """\
shardingPolicy: DYNAMIC
workers:
  replicas: 2
  volumes: [{name: home, hostPath: {path: /home}}]
  volumeMounts: [{name: home, mountPath: /data}]
"""
# Accepted by the schema, refused by the operator (InvalidSpec): the schema cannot compare quantities.
REQUESTS_ABOVE_LIMITS = """\
shardingPolicy: DYNAMIC
workers:
  replicas: 2
  resources:
    requests: {memory: 2Gi}
    limits: {memory: 1Gi}
"""


@dataclass(frozen=True)
class Unready:
    """A TFDataService the API accepts whose pods cannot get ready, and what its ``condition`` and
    Ready must say: Kubernetes' own ``reason`` and fragments (``says``) of its message."""

    name: str
    spec: str  # YAML text, as BadSpec's
    condition: str
    reason: str
    says: tuple[str, ...]


KWOK = json.dumps(devcluster.KWOK_TOLERATION)
# What the injected server program says in an image without TensorFlow (the kwok Stage's copy of it).
NO_TENSORFLOW = (
    "tfdata-server: this image has no TensorFlow (Python 3.11.2 at /opt/venv/bin/python3 finds no module named "
    "tensorflow); the server program needs TensorFlow 2.16 or newer: use an image with TensorFlow as spec.image"
)

# The kubelet's two failures, one spec for both kinds of cluster. On the integration tier's node-less
# cluster the dispatcher tolerates kwok's node and carries the label of the project's kwok Stage
# (devcluster/kwok/stages.yaml) that writes what a kubelet reports; on kind (tests/kind, and the integration
# suite run there) the label and the toleration change nothing, and a real kubelet fails for real.
KUBELET_FAILURES = [
    # Nothing listens on the node's own localhost:1, so every pull is refused at once, and
    # imagePullPolicy Always makes the kubelet try (no such image is in the node either).
    Unready(
        "no-image",
        "shardingPolicy: DYNAMIC\nimage: localhost:1/tfdata-server:none\nimagePullPolicy: Always\n"
        "dispatcher:\n  faultTolerantMode: false\n  storage: {enabled: false}\n"
        f"  tolerations: [{KWOK}]\n  labels: {{image-pull-backoff.stage.tfdata.dev: 'true'}}\n"
        "workers: {replicas: 1, resources: {requests: {cpu: 50m, memory: 256Mi}}}",
        "DispatcherReady",
        "ImagePullBackOff",
        (
            "The dispatcher is not ready: Pod no-image-dispatcher-0: container dispatcher is in ImagePullBackOff: "
            'Back-off pulling image "localhost:1/tfdata-server:none": ErrImagePull: '
            'failed to pull and unpack image "localhost:1/tfdata-server:none": '
            'failed to resolve reference "localhost:1/tfdata-server:none": failed to do request: ',
            "connect: connection refused",
        ),
    ),
    # A journal in a workDir the server cannot create (the container's root filesystem is
    # read-only): the dispatcher exits at start, and the kubelet backs off restarting it. Its
    # worker is left unscheduled: it would only wait for that dispatcher.
    Unready(
        "crashing",
        "shardingPolicy: DYNAMIC\n"
        "dispatcher:\n  faultTolerantMode: true\n  storage: {enabled: false}\n  workDir: /var/lib/tfdata/journal\n"
        f"  tolerations: [{KWOK}]\n  labels: {{crash-loop-backoff.stage.tfdata.dev: 'true'}}\n"
        "workers: {replicas: 1, nodeSelector: {tfdata.dev/test: none}}",
        "DispatcherReady",
        "CrashLoopBackOff",
        (
            "The dispatcher is not ready: Pod crashing-dispatcher-0: container dispatcher is in CrashLoopBackOff: "
            "back-off ",
            "restarting failed container=dispatcher pod=crashing-dispatcher-0_",
            "it last exited with code 1 (Error)",
        ),
    ),
    # An image with Python and no TensorFlow (the operator's own) as a user's: the injected server
    # program says so as it exits (its last log line becomes the termination message), and the
    # condition is UnsupportedImage with that sentence, not a bare crash loop.
    Unready(
        "no-tensorflow",
        f"shardingPolicy: DYNAMIC\nimage: tfdata-operator:{__version__}\nserverProgram: Injected\n"
        "dispatcher:\n  faultTolerantMode: false\n  storage: {enabled: false}\n"
        f"  tolerations: [{KWOK}]\n  labels: {{crash-loop-backoff.stage.tfdata.dev: 'true'}}\n"
        "  annotations:\n    crash-loop-backoff.stage.tfdata.dev/exit-code: '3'\n"
        f"    crash-loop-backoff.stage.tfdata.dev/message: {json.dumps(NO_TENSORFLOW)}\n"
        "workers: {replicas: 1, nodeSelector: {tfdata.dev/test: none}}",
        "DispatcherReady",
        "UnsupportedImage",
        (
            "The dispatcher is not ready: Pod no-tensorflow-dispatcher-0: container dispatcher (image ",
            "cannot serve: tfdata-server: this image has no TensorFlow (Python ",
            "; the server program needs TensorFlow 2.16 or newer: use an image with TensorFlow as spec.image",
        ),
    ),
]


def conditions(kubectl: Kubectl, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    """A TFDataService's conditions by type, from one read."""
    obj = kubectl.get("tfdataservice", name, "-n", namespace) or {}
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def wait_explained(kubectl: Kubectl, namespace: str, case: Unready, timeout: float) -> dict[str, Any]:
    """Waits for ``case.condition`` and Ready to give ``case.reason`` (Ready names it once the rest of
    the service is up), checks what they say, and returns the condition."""

    def pods() -> Any:
        items = kubectl.json("get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={case.name}")["items"]
        return [(p["metadata"]["name"], p.get("status")) for p in items]

    seen = wait_for(
        lambda: conditions(kubectl, namespace, case.name),
        timeout,
        f"{case.condition} and Ready to say {case.reason} on {case.name}",
        until=lambda c: c.get(case.condition, {}).get("reason") == c.get("Ready", {}).get("reason") == case.reason,
        show=lambda: (conditions(kubectl, namespace, case.name), pods()),
    )
    found, ready = seen[case.condition], seen["Ready"]
    assert found["status"] == "False"
    for words in case.says:
        assert words in found["message"], found
    assert (ready["status"], ready["message"]) == ("False", found["message"])
    return found


# --- What the CRDs allow in a status -------------------------------------------------------


def status_schema(crd: Path) -> dict[str, Any]:
    schema: dict[str, Any] = yaml.safe_load(crd.read_text())["spec"]["versions"][0]["schema"]
    return schema["openAPIV3Schema"]["properties"]["status"]  # type: ignore[no-any-return]


def crd_bounds(schema: dict[str, Any], at: str = "") -> dict[str, int]:
    """Every ``maxLength`` and ``maxItems`` under ``schema``, by path ("[]" for a list's items)."""
    bound = schema.get("maxLength", schema.get("maxItems"))  # a field is a string or a list
    bounds: dict[str, int] = {} if bound is None else {at: bound}
    for key, sub in (schema.get("properties") or {}).items():
        bounds |= crd_bounds(sub, f"{at}.{key}" if at else key)
    if isinstance(schema.get("items"), dict):
        bounds |= crd_bounds(schema["items"], f"{at}[]")
    return bounds


def beyond_crd(value: Any, schema: dict[str, Any], at: str = "status") -> list[str]:
    """What in ``value`` the API server would refuse for a string or list over its bound, or a field
    the schema does not declare (a 422 for the whole patch): one line each."""
    if value is None:
        return []  # a merge patch's removal
    if isinstance(value, str):
        most = schema.get("maxLength")
        return [f"{at}: {len(value)} characters, over {most}"] if most is not None and len(value) > most else []
    if isinstance(value, list):
        most, items = schema.get("maxItems"), schema.get("items") or {}
        over = [f"{at}: {len(value)} items, over {most}"] if most is not None and len(value) > most else []
        return over + [line for i, item in enumerate(value) for line in beyond_crd(item, items, f"{at}[{i}]")]
    if isinstance(value, dict):
        declared = schema.get("properties") or {}
        return [
            line
            for key, item in value.items()
            for line in (
                beyond_crd(item, declared[key], f"{at}.{key}")
                if key in declared
                else [f"{at}.{key}: not in the schema"]
            )
        ]
    return []
