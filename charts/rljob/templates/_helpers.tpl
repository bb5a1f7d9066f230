{{/*
Names. Every define is prefixed "rljob." (the chart's name), as cert-manager's chart does.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "rljob.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name: the release name alone when it already contains the chart name. */}}
{{- define "rljob.fullname" -}}
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

{{/* The operator's Deployment, Service, ClusterRole, Lease: "<fullname>-operator". */}}
{{- define "rljob.operatorName" -}}
{{- printf "%s-operator" (include "rljob.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/* The admission policies (templates/admission-policies.yaml), which the operator checks are in force. */}}
{{- define "rljob.referencesPolicyName" -}}
{{- printf "%s-job-references" (include "rljob.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "rljob.queuesPolicyName" -}}
{{- printf "%s-queues" (include "rljob.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "rljob.runtimeUsePolicyName" -}}
{{- printf "%s-runtime-use" (include "rljob.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "rljob.runtimeReferencesPolicyName" -}}
{{- printf "%s-runtime-references" (include "rljob.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "rljob.workerPodsPolicyName" -}}
{{- printf "%s-worker-pods" (include "rljob.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{/* Every admission policy of the chart, as a JSON list. */}}
{{- define "rljob.admissionPolicyNames" -}}
{{- list (include "rljob.referencesPolicyName" .) (include "rljob.queuesPolicyName" .)
      (include "rljob.runtimeUsePolicyName" .) (include "rljob.runtimeReferencesPolicyName" .)
      (include "rljob.workerPodsPolicyName" .) | toJson }}
{{- end }}

{{- define "rljob.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Standard labels, on every object the chart renders. */}}
{{- define "rljob.labels" -}}
helm.sh/chart: {{ include "rljob.chart" . }}
app.kubernetes.io/name: {{ include "rljob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rljob
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector of the operator's pods (immutable in a Deployment: never add to it). */}}
{{- define "rljob.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rljob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "rljob.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rljob.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rljob.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* Name of the Secret holding the status API's serving certificate. */}}
{{- define "rljob.tlsSecretName" -}}
{{- if .Values.statusAPI.tls.secretName }}
{{- .Values.statusAPI.tls.secretName }}
{{- else if eq .Values.statusAPI.tls.source "existingSecret" }}
{{- fail "statusAPI.tls.secretName is required when statusAPI.tls.source is existingSecret" }}
{{- else }}
{{- printf "%s-status-tls" (include "rljob.operatorName" .) }}
{{- end }}
{{- end }}

{{/* Whether the operator mounts its serving certificate from a Secret (no Secret RBAC needed). */}}
{{- define "rljob.tlsFromFiles" -}}
{{- if has .Values.statusAPI.tls.source (list "existingSecret" "certManager") }}true{{ end }}
{{- end }}

{{/* The operator's settings for every job's NetworkPolicy: who may scrape trainers (JSON NetworkPolicyPeers). */}}
{{- define "rljob.trainerMetricsFrom" -}}
{{- $m := .Values.networkPolicy.monitoring }}
{{- list (dict "namespaceSelector" $m.namespaceSelector "podSelector" $m.podSelector) | toJson }}
{{- end }}

{{/* Namespaces that get the trainers' ServiceAccount: watchNamespaces plus trainerServiceAccount.namespaces. */}}
{{- define "rljob.trainerNamespaces" -}}
{{- $all := concat .Values.watchNamespaces .Values.trainerServiceAccount.namespaces | uniq }}
{{- toJson $all }}
{{- end }}

{{/* Rules for the objects of RLTrainingJobs, in whichever namespaces the operator watches. */}}
{{- define "rljob.jobRules" -}}
# Jobs: watched by kopf, read by the reconciler and the status API, deleted after ttlSecondsAfterFinished.
- apiGroups: ["rljob.dev"]
  resources: ["rltrainingjobs"]
  verbs: ["get", "list", "watch", "delete"]
# Status (phase, conditions, progress from heartbeats) goes through the status subresource only.
- apiGroups: ["rljob.dev"]
  resources: ["rltrainingjobs/status"]
  verbs: ["patch"]
# Experiments: watched and read; their status written; each trial is an RLTrainingJob the operator
# creates (owned by the experiment, so finalizers update: blockOwnerDeletion) and suspends when pruned.
- apiGroups: ["rljob.dev"]
  resources: ["rlexperiments"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["rljob.dev"]
  resources: ["rlexperiments/status"]
  verbs: ["patch"]
- apiGroups: ["rljob.dev"]
  resources: ["rlexperiments/finalizers"]
  verbs: ["update"]
- apiGroups: ["rljob.dev"]
  resources: ["rltrainingjobs"]
  verbs: ["create", "patch"]
# A namespace's own runtimes (RLTrainingRuntime): listed and watched into the operator's cache (a job
# names one, or gets its namespace's default); never written.
- apiGroups: ["rljob.dev"]
  resources: ["rltrainingruntimes"]
  verbs: ["list", "watch"]
# Worker pods: watched, created under deterministic names, deleted on gang restarts; the status
# API reads a heartbeat's pod to check it belongs to the job. A concluded experiment's one-shot
# record pod (its ConfigMap and NetworkPolicy: the rules below) is created and read the same way.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Each job's ConfigMap (trainer config, status CA) and headless rendezvous Service: created or
# adopted (patch adds an ownerReference or updates the config); a Service with a selector (an
# earlier version's) is deleted and made again without one.
- apiGroups: [""]
  resources: ["configmaps", "services"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["delete"]
# The rendezvous Service's EndpointSlice: the address of the worker 0 the operator created, written
# by the operator (a selector would route by labels any pod may copy).
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "create", "patch"]
{{- if .Values.networkPolicy.enabled }}
# Each job's NetworkPolicy (only its own pods reach its workers): created, or adopted and brought
# up to date (patch).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch"]
{{- end }}
# Phase transitions are reported as Events on the job; a repeated one bumps its count (patch).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.kueue.enabled }}
# Kueue: each queued job's Workload (its whole gang): watched, created, deleted when the job is
# suspended or resized; its status is patched to give the quota back (evicted gang stopped,
# job finished), as Kueue's own job integrations do.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end }}
{{- end }}

{{/* The trainer image of the chart's runtimes: runtimes.image, its tag defaulting to appVersion. */}}
{{- define "rljob.trainerImage" -}}
{{- $image := .Values.runtimes.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/*
JSON of dict "base" with dict "over" merged over it: maps merge key by key, anything else in "over"
replaces (a list, a false, a 0: Sprig's merge would keep the base's non-empty value instead).
*/}}
{{- define "rljob.merge" -}}
{{- $out := deepCopy .base }}
{{- range $key, $value := .over }}
{{- $was := get $out $key }}
{{- if and (kindIs "map" $value) (kindIs "map" $was) }}
{{- $_ := set $out $key (include "rljob.merge" (dict "base" $was "over" $value) | fromJson) }}
{{- else }}
{{- $_ := set $out $key $value }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The chart's ClusterRLTrainingRuntimes as JSON, name → {"open": bool, "spec": the runtime's spec}: "default"
and "cpu" unless disabled, then runtimes.extra. Each spec is what the values build (image, pull secrets,
the pod template's ServiceAccount and securityContexts, checkpoint) with the runtime's own `spec` merged over.
*/}}
{{- define "rljob.runtimes" -}}
{{- $v := .Values.runtimes }}
{{- $entries := dict }}
{{- range $name := list "default" "cpu" }}
{{- $entry := get $v $name }}
{{- if $entry.enabled }}
{{- $_ := set $entries $name (dict "open" $entry.openToJobCreators "spec" ($entry.spec | default (dict))) }}
{{- end }}
{{- end }}
{{- range $name, $entry := $v.extra }}
{{- if hasKey $entries $name }}
{{- fail (printf "runtimes.extra.%s: the chart already makes a runtime %q (runtimes.%s); give this one another name" $name $name $name) }}
{{- end }}
{{- $_ := set $entries $name (dict "open" ($entry.openToJobCreators | default false) "spec" ($entry.spec | default (dict))) }}
{{- end }}
{{- if and $v.defaultName (not (hasKey $entries $v.defaultName)) }}
{{- fail (printf "runtimes.defaultName %q names none of the chart's runtimes (%s): enable it, add it to runtimes.extra, or set runtimes.defaultName to \"\"" $v.defaultName (keys $entries | sortAlpha | join ", ")) }}
{{- end }}
{{- $account := $v.serviceAccountName }}
{{- if and (not $account) .Values.trainerServiceAccount.create }}
{{- $account = .Values.trainerServiceAccount.name }}
{{- end }}
{{- $podSpec := dict "securityContext" $v.podSecurityContext
      "containers" (list (dict "name" "trainer" "securityContext" $v.securityContext)) }}
{{- if $account }}
{{- $_ := set $podSpec "serviceAccountName" $account }}
{{- end }}
{{- $base := dict "image" (include "rljob.trainerImage" .) "imagePullPolicy" $v.image.pullPolicy
      "podTemplate" (dict "spec" $podSpec) }}
{{- with $v.imagePullSecrets }}
{{- $_ := set $base "imagePullSecrets" . }}
{{- end }}
{{- with $v.checkpoint }}
{{- $_ := set $base "checkpoint" . }}
{{- end }}
{{- $out := dict }}
{{- range $name, $entry := $entries }}
{{- $spec := include "rljob.merge" (dict "base" $base "over" $entry.spec) | fromJson }}
{{- $_ := set $out $name (dict "open" $entry.open "spec" $spec) }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* Names of the chart's runtimes every job creator may use (openToJobCreators), as a JSON list. */}}
{{- define "rljob.openRuntimes" -}}
{{- $open := list }}
{{- range $name, $entry := (include "rljob.runtimes" . | fromJson) }}
{{- if $entry.open }}
{{- $open = append $open $name }}
{{- end }}
{{- end }}
{{- toJson $open }}
{{- end }}

{{/* The rule granting `use` of the runtimes named in the list; nothing for none (an empty resourceNames means all). */}}
{{- define "rljob.runtimeUseRules" -}}
{{- if . -}}
# Run jobs on these runtimes of the chart (the admission policy asks for this verb).
- apiGroups: ["rljob.dev"]
  resources: ["clusterrltrainingruntimes"]
  resourceNames: {{ toJson . }}
  verbs: ["use"]
{{- end }}
{{- end }}
