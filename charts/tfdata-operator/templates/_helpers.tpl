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
ClusterRole (every namespace) or by one Role per watched namespace. Each rule names
the operator code (or kopf) that needs it; test_rbac.py runs the operator with exactly
these rules and checks that nothing is refused.
*/}}
{{- define "tfdata-operator.namespacedRules" -}}
# kopf lists and watches TFDataServices and patches its bookkeeping annotations onto them;
# reconcile.reconcile reads each one fresh (get).
- apiGroups: ["tfdata.dev"]
  resources: ["tfdataservices"]
  verbs: ["get", "list", "watch", "patch"]
# reconcile._write_status: a merge patch of the status subresource.
- apiGroups: ["tfdata.dev"]
  resources: ["tfdataservices/status"]
  verbs: ["patch"]
# Children carry ownerReferences with blockOwnerDeletion: true. Where the
# OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift, hardened
# clusters), setting that needs update on the owner's finalizers.
- apiGroups: ["tfdata.dev"]
  resources: ["tfdataservices/finalizers"]
  verbs: ["update"]
# Children: read (reconcile.observe), watched by kopf (handlers.*_changed), written by
# server-side apply (patch; create when the object does not exist yet), and deleted:
# a StatefulSet to change an immutable field, an HPA when spec.autoscaling goes away.
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Services are never deleted by the operator (only by garbage collection).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Children the operator is about to manage the same way as the ones above.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# reconcile.observe lists a service's pods; scaling.stuck_pods' pods are deleted.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "delete"]
# Events on TFDataServices, posted by Kube.event and by kopf.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/* resources: only the quantities that are set. */}}
{{- define "tfdata-operator.resources" -}}
{{- range $kind := list "requests" "limits" }}
{{- $set := dict }}
{{- range $k, $v := (get $.Values.resources $kind | default dict) }}
{{- if not (kindIs "invalid" $v) }}{{ $_ := set $set $k $v }}{{ end }}
{{- end }}
{{- if $set }}
{{ $kind }}:
{{- toYaml $set | nindent 2 }}
{{- end }}
{{- end }}
{{- end }}
