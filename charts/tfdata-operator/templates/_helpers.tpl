{{/* The chart's name, overridable. */}}
{{- define "tfdata-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The base name of every object: <release>-<chart>, or the release name if it holds the chart name. */}}
{{- define "tfdata-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels that select the operator pod; they never change across upgrades. */}}
{{- define "tfdata-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tfdata-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The operator pod's labels the services' NetworkPolicies select it by, as key=value,key=value. */}}
{{- define "tfdata-operator.operatorPodLabels" -}}
{{- $labels := .Values.networkPolicy.operatorPodLabels | default (include "tfdata-operator.selectorLabels" . | fromYaml) -}}
{{- $pairs := list -}}
{{- range $key, $value := $labels }}{{ $pairs = append $pairs (printf "%s=%s" $key $value) }}{{ end -}}
{{- join "," $pairs -}}
{{- end }}

{{/* Labels on every object the chart creates: `-l app.kubernetes.io/instance=<release>` finds them all. */}}
{{- define "tfdata-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tfdata-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end }}

{{/* "true" when the replicas elect a leader on a Lease (more than one, or asked for), else "". */}}
{{- define "tfdata-operator.leaderElection" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicaCount) 1) }}true{{ end }}
{{- end }}

{{- define "tfdata-operator.serviceAccountName" -}}
{{ include "tfdata-operator.fullname" . }}
{{- end }}

{{- define "tfdata-operator.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "tfdata-operator.serverImage" -}}
{{ .Values.serverImage.repository }}:{{ .Values.serverImage.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
What the operator does inside a namespace it watches: one rule list, used by the
ClusterRole (every namespace) or by one Role per watched namespace. Each rule says which
code needs it and what fails without it (each was taken away in turn, with the operator
running). tests/integration/test_rbac.py runs the operator with exactly these rules.
No wildcards, no Secrets, no ConfigMaps but its own, no PUT (update): the operator writes by
server-side apply and merge patches only.
*/}}
{{- define "tfdata-operator.namespacedRules" -}}
{{- /* The same rules as children.namespaced_rules() in the operator (tests/integration/test_rbac.py
compares them): list and watch every kind the operator observes, plus what each kind's row in
operator/src/tfdata_operator/children.py says it does. */}}
# kopf lists and watches TFDataServices into the operator's cache (without: no reconcile at all).
# The operator reads nothing with get: every reconcile works from the watches' cache.
- apiGroups: ["tfdata.dev"]
  resources: ["tfdataservices"]
  verbs: ["list", "watch"]
# The status is written with a merge patch of the status subresource (without: no
# conditions, no dispatcherAddress).
- apiGroups: ["tfdata.dev"]
  resources: ["tfdataservices/status"]
  verbs: ["patch"]
# The TFData autoscaler sets the worker count through the scale subresource, as `kubectl scale`
# does (without: autoscaling never scales).
- apiGroups: ["tfdata.dev"]
  resources: ["tfdataservices/scale"]
  verbs: ["patch"]
# TFDataSnapshots are watched, their status written (state, progress), and their finalizer
# added and removed with a patch (deletionPolicy Delete: the data is deleted before the object
# goes). Without: `kubectl get tfdatasnapshots` shows no state, and a deletion deletes no data.
- apiGroups: ["tfdata.dev"]
  resources: ["tfdatasnapshots"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["tfdata.dev"]
  resources: ["tfdatasnapshots/status"]
  verbs: ["patch"]
# Children carry ownerReferences with blockOwnerDeletion: true. Where the
# OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift, hardened
# clusters), that needs update on the owner's finalizers: without it every child is
# refused ("cannot set blockOwnerDeletion ...") and nothing is created.
- apiGroups: ["tfdata.dev"]
  resources: ["tfdataservices/finalizers"]
  verbs: ["update"]
# Children written by server-side apply: patch, and create, which an apply that creates
# the object also needs. list and watch (filtered by the managed-by label): the cache, and
# a child's change (a pod becoming ready, a NetworkPolicy deleted by hand) is acted on at
# once. delete: a StatefulSet is recreated when a field it cannot update changes; an HPA,
# PodDisruptionBudget or NetworkPolicy is deleted when the spec stops asking for it.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "patch"]
# The <name>-client ConfigMap trainers read the service's settings from (envFrom). The
# watch is filtered by the operator's label: it reads no other ConfigMap.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# The service's pods are watched into the cache (without: no scaling decision), and a pod
# stuck on an old revision or a worker stale after a dispatcher restart is deleted (without:
# a static-sharding scale-up waits forever for the dispatcher to restart).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "delete"]
# Events on TFDataServices (Created, Scaled, InvalidSpec, ...); patch: the same Event again adds
# one to its count (without: it is not recorded again). list (filtered by the object):
# only for a service that is not ready, the Events of its StatefulSet (FailedCreate) and journal
# claim (ProvisioningFailed), so its conditions say why (without: they say only "not ready").
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch", "list"]
# spec.lifecycle: the operator patches a TFDataService itself (spec.suspend: true once its workload
# finished, or nobody read for idle.suspendAfterSeconds; metadata.ownerReferences to its workload
# with deleteWithWorkload) and deletes it (afterWorkloadFinishes action Delete). Without: those rules
# fail with 403 and the service runs on. Only for services whose spec.lifecycle asks for it.
- apiGroups: ["tfdata.dev"]
  resources: ["tfdataservices"]
  verbs: ["patch", "delete"]
# spec.lifecycle.workload: the Job or JobSet a service follows, read by name (get only: no list, no
# watch; without: status.lifecycle says Unreadable and nothing is done). Other kinds: values
# lifecycle.workloadKinds.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get"]
- apiGroups: ["jobset.x-k8s.io"]
  resources: ["jobsets"]
  verbs: ["get"]
{{- range .Values.lifecycle.workloadKinds }}
- apiGroups: [{{ .apiGroup | quote }}]
  resources: [{{ .resource | quote }}]
  verbs: ["get"]
{{- end }}
# spec.nodeLoss: a dispatcher pod on a node that stopped answering, whose journal claim's volume
# only that node reaches, loses the claim (deleted, so its StatefulSet makes a new one elsewhere);
# get: the claim's volume. Read only for such a dispatcher (without: it is never replaced).
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "delete"]
{{- if .Values.kueue.enabled }}
# kueue.enabled: each queued TFDataService's Kueue Workload, written by server-side apply, watched,
# deleted when the service is suspended or leaves the queue (children.kueue_rules()); its status
# patched to release an evicted Workload's quota and to say its pods are Ready (without: an evicted
# service keeps its quota, and waitForPodsReady evicts a running one).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end }}
{{- end }}

{{- define "tfdata-operator.clusterRules" -}}
{{- /* children.cluster_rules() in the operator (tests/integration/test_rbac.py compares them). */ -}}
# spec.nodeLoss: the Node of a pod that is not Ready, to see whether it is known to be off (tainted
# out-of-service, or deleted) or only unreachable; get only: no Node is listed or watched (without:
# pods on a lost node stay Terminating until a person force-deletes them).
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get"]
# A lost dispatcher's journal volume: get, to see whether only that node reaches it; patch, to set its
# reclaim policy to Retain before its claim is let go, so the old journal is never deleted.
- apiGroups: [""]
  resources: ["persistentvolumes"]
  verbs: ["get", "patch"]
{{- if .Values.kueue.enabled }}
# kueue.enabled: an admitted Workload's ResourceFlavors (their node labels and tolerations go into the
# pods) and a service's WorkloadPriorityClass (its value), each read by name.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["resourceflavors", "workloadpriorityclasses"]
  verbs: ["get"]
{{- end }}
{{- end }}

{{/* resources: only the quantities that are set (null removes a default). */}}
{{- define "tfdata-operator.resources" -}}
{{- $out := dict }}
{{- range $kind := list "requests" "limits" }}
{{- $set := dict }}
{{- range $k, $v := (get $.Values.resources $kind | default dict) }}
{{- if not (kindIs "invalid" $v) }}{{ $_ := set $set $k $v }}{{ end }}
{{- end }}
{{- if $set }}{{ $_ := set $out $kind $set }}{{ end }}
{{- end }}
{{- toYaml $out }}
{{- end }}
