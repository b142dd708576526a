{{/* Chart name, truncated to 63 characters. */}}
{{- define "finetune-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart> (or the release name when it contains the chart name), truncated to 63. */}}
{{- define "finetune-operator.fullname" -}}
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

{{/* A suffixed name, the prefix shortened so the whole fits 63 characters. */}}
{{- define "finetune-operator.suffixed" -}}
{{- $prefix := include "finetune-operator.fullname" .root }}
{{- printf "%s-%s" ($prefix | trunc (int (sub 62 (len .suffix))) | trimSuffix "-") .suffix }}
{{- end }}

{{- define "finetune-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable across upgrades, never helm.sh/chart. */}}
{{- define "finetune-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "finetune-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "finetune-operator.labels" -}}
helm.sh/chart: {{ include "finetune-operator.chart" . }}
{{ include "finetune-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: finetune-operator
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The annotations block of an object: commonAnnotations and the object's own ("extra", which win); nothing when
both are empty. Usage: {{- with include "finetune-operator.annotations" (dict "root" $ "extra" X) }}{{ . | nindent 2 }}{{- end }} */}}
{{- define "finetune-operator.annotations" -}}
{{- $all := merge (dict) (default (dict) .extra) (default (dict) .root.Values.commonAnnotations) }}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A security context; with openshift.enabled without the fixed IDs, which OpenShift's restricted SCC assigns per
namespace (it refuses a runAsUser outside the namespace's range). */}}
{{- define "finetune-operator.securityContext" -}}
{{- $ctx := deepCopy (default (dict) .context) }}
{{- if .root.Values.openshift.enabled }}
{{- $ctx = omit $ctx "runAsUser" "runAsGroup" "fsGroup" }}
{{- end }}
{{- toYaml $ctx }}
{{- end }}

{{- define "finetune-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "finetune-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "finetune-operator.image" -}}
{{- include "finetune-operator.imageRef" (dict "root" . "image" .Values.image) }}
{{- end }}

{{/* repository@digest when a digest is set (a released chart pins them), else repository:tag (tag: appVersion). */}}
{{- define "finetune-operator.imageRef" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{- define "finetune-operator.trainerImage" -}}
{{- include "finetune-operator.imageRef" (dict "root" . "image" .Values.trainer.image) }}
{{- end }}

{{/* The cpu runtime's trainer image: trainer.cpuImage, or trainer.image when its repository is empty. */}}
{{- define "finetune-operator.trainerCpuImage" -}}
{{- if .Values.trainer.cpuImage.repository }}
{{- include "finetune-operator.imageRef" (dict "root" . "image" .Values.trainer.cpuImage) }}
{{- else }}
{{- include "finetune-operator.trainerImage" . }}
{{- end }}
{{- end }}

{{- define "finetune-operator.trainerOrtImage" -}}
{{- include "finetune-operator.imageRef" (dict "root" . "image" .Values.trainer.ortImage) }}
{{- end }}

{{/* Validated watched namespaces: required, and only meaningful, for rbac.scope=namespaced. */}}
{{- define "finetune-operator.watchNamespaces" -}}
{{- if eq .Values.rbac.scope "namespaced" }}
{{- if not .Values.rbac.watchNamespaces }}
{{- fail "rbac.scope=namespaced needs rbac.watchNamespaces (the namespaces whose FineTuneJobs the operator runs)" }}
{{- end }}
{{- join "," (uniq .Values.rbac.watchNamespaces) }}
{{- end }}
{{- end }}

{{/*
The operator's permissions, shared by the ClusterRole (rbac.scope=cluster) and each namespaced Role.
Exactly the calls the operator makes (operator/finetune_operator/k8s.py) plus what kopf needs; the chart tests
prove both that it suffices (the operator runs as this ServiceAccount) and that it is no more (a permission matrix).
*/}}
{{- define "finetune-operator.nodeRules" -}}
{{- if ne .Values.operator.forceDelete.mode "never" }}
# Nodes: read only for a trainer pod stuck terminating past its grace period, to force-delete it only when its node is
# lost (gone, out-of-service, or NotReady; operator.forceDelete), never while the old processes may still run.
- apiGroups: [""]
  resources: [nodes]
  verbs: [get]
{{- end }}
{{- end -}}

{{- define "finetune-operator.kueueClusterRules" -}}
{{- if .Values.kueue.enabled }}
# Kueue's cluster-scoped queue objects, read for a job with spec.topology before its first pod (docs/placement.md).
- apiGroups: [kueue.x-k8s.io]
  resources: [clusterqueues, resourceflavors, topologies]
  verbs: [get]
{{- end }}
{{- end -}}

{{- define "finetune-operator.rules" -}}
# FineTuneJobs: watched by kopf and the backstop resync; deleted when ttlSecondsAfterFinished expires.
- apiGroups: [finetune.dev]
  resources: [finetunejobs]
  verbs: [get, list, watch, delete]
# Status is written with PUT (update), only when it changed.
- apiGroups: [finetune.dev]
  resources: [finetunejobs/status]
  verbs: [update]
# Children carry blockOwnerDeletion: where the OwnerReferencesPermissionEnforcement admission plugin is on
# (OpenShift), setting it needs update on the owner's finalizers subresource. The operator adds no finalizer.
- apiGroups: [finetune.dev]
  resources: [finetunejobs/finalizers]
  verbs: [update]
# Runtimes of the job's namespace: read when an attempt starts (the cluster-wide ones: finetune-operator.runtimeRules).
- apiGroups: [finetune.dev]
  resources: [finetuneruntimes]
  verbs: [get, list]
# Trainer pods: found by label, created per rank, deleted on gang restart and on final failure.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete]
# The headless rendezvous Service and the resolved-config ConfigMap: created once, cleaned up by owner references.
# get: a create answered "already exists" is checked for its owner, so that a deleted job's objects of the same name
# are waited out, never adopted (no more than the pods the operator creates could read anyway).
- apiGroups: [""]
  resources: [services]
  verbs: [create, get]
# update: the ConfigMap is rewritten when an attempt starts with a config that changed (a mutable spec field).
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create, get, update]
# Output claims: read (access-mode check before an attempt starts) and created from spec.output.volumeClaimTemplate;
# never deleted by the operator (owner references, or kept with reclaimPolicy Retain).
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, create]
# The opt-in PodDisruptionBudget of a running gang (spec.podDisruptionBudget), deleted when the job stops.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [create, delete, get]
# The NetworkPolicy of a job's pods (trainerNetworkPolicy): created once, cleaned up by owner references; get as for
# Services (a namesake's is waited out).
{{- if .Values.trainerNetworkPolicy.enabled }}
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, get]
{{- end }}
# Events on FineTuneJobs (the operator's and kopf's).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- with .Values.gangScheduling.scheduler }}
# Each attempt's PodGroup for the gang scheduler (gangScheduling.scheduler): created before its ranks, the previous
# attempt's deleted when the next starts; get as for Services (one that exists already is checked for its owner).
- apiGroups: [{{ ternary "scheduling.x-k8s.io" "scheduling.volcano.sh" (eq . "coscheduling") }}]
  resources: [podgroups]
  verbs: [create, delete, get]
{{- end }}
{{- if .Values.kueue.enabled }}
# Kueue's Workload of a queued attempt, read for its admission message (condition Queued); and with MultiKueue
# (docs/placement.md) the Workload of a job with spec.managedBy, which the operator creates on the manager cluster
# and deletes when the job is suspended (MultiKueue then removes the worker's copy).
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, create, delete]
# MultiKueue, on a worker cluster: the Workload a dispatched copy was admitted as is marked Finished when it ends.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [patch]
# A job with spec.topology: its LocalQueue, read before its first pod to check that the queue can place it (with the
# cluster-scoped ClusterQueue, ResourceFlavors and Topologies: kueueClusterRules; docs/placement.md); never written.
- apiGroups: [kueue.x-k8s.io]
  resources: [localqueues]
  verbs: [get]
{{- end }}
{{- end }}

{{/* The trainer NetworkPolicy's peers for the metrics port, as JSON: the operator's own pods (its progress scrape)
and metricsFrom. Empty metricsFrom: the operator only (a tenant's pod reads no other job's loss or names); a
PodMonitor then needs metricsFrom to name Prometheus, and the chart says so. */}}
{{- define "finetune-operator.metricsFrom" -}}
{{- $peers := .Values.trainerNetworkPolicy.metricsFrom }}
{{- if and .Values.metrics.podMonitor.enabled .Values.trainerNetworkPolicy.enabled (not $peers) }}
{{- fail "metrics.podMonitor.enabled: the trainer pods' NetworkPolicy admits only the operator on the metrics port; set trainerNetworkPolicy.metricsFrom to your Prometheus' namespace (e.g. [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]), or to [{namespaceSelector: {}}] for every namespace" }}
{{- end }}
{{- $self := dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" .Release.Namespace)) "podSelector" (dict "matchLabels" (include "finetune-operator.selectorLabels" . | fromYaml)) }}
{{- toJson (append $peers $self) }}
{{- end -}}

{{/* Cluster-wide runtimes: read when an attempt starts, never written. */}}
{{- define "finetune-operator.runtimeRules" -}}
- apiGroups: [finetune.dev]
  resources: [clusterfinetuneruntimes]
  verbs: [get, list]
{{- end }}
