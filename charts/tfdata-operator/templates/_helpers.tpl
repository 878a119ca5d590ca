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

{{/* Labels on every object the chart creates: `-l app.kubernetes.io/instance=<release>` finds them all. */}}
{{- define "tfdata-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tfdata-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
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
No wildcards, no Secrets, no ConfigMaps, no PUT (update): the operator writes by
server-side apply and merge patches only.
*/}}
{{- define "tfdata-operator.namespacedRules" -}}
# kopf lists and watches TFDataServices (without: no reconcile on create or change) and
# merge-patches its bookkeeping annotations onto them (without: every handler run fails and
# is retried); every reconcile reads the TFDataService fresh (get).
- apiGroups: ["tfdata.dev"]
  resources: ["tfdataservices"]
  verbs: ["get", "list", "watch", "patch"]
# The status is written with a merge patch of the status subresource (without: no
# conditions, no dispatcherAddress).
- apiGroups: ["tfdata.dev"]
  resources: ["tfdataservices/status"]
  verbs: ["patch"]
# Children carry ownerReferences with blockOwnerDeletion: true. Where the
# OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift, hardened
# clusters), that needs update on the owner's finalizers: without it every child is
# refused ("cannot set blockOwnerDeletion ...") and nothing is created.
- apiGroups: ["tfdata.dev"]
  resources: ["tfdataservices/finalizers"]
  verbs: ["update"]
# Children written by server-side apply: patch, and create, which an apply that creates
# the object also needs; get, as every reconcile reads them. kopf lists and watches
# StatefulSets, Services and HPAs so that a child's change (a pod becoming ready, a
# Service deleted by hand) is acted on at once rather than at the next resync.
# delete: a StatefulSet is recreated when a field it cannot update changes; an HPA,
# PodDisruptionBudget or NetworkPolicy is deleted when the spec stops asking for it.
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch", "delete"]
# A reconcile lists the service's pods (without: no reconcile gets past observing), and
# deletes a pod stuck Pending on an old revision (without: a static-sharding scale-up
# waits forever for the dispatcher to restart).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "delete"]
# Events on TFDataServices (Created, InvalidSpec, ...), from the operator and kopf.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
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
