{{/* Names and labels. */}}
{{- define "sluice.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The operator's pods: the Deployment's selector, and what its Service, policies and budget select. */}}
{{- define "sluice.operatorSelectorLabels" -}}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sluice
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sluice.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "sluice.ha" -}}
{{- if gt (int .Values.replicaCount) 1 }}true{{ end }}
{{- end }}

{{/* The webhook: its Service, the Secret with its serving certificate, and that certificate's names. */}}
{{- define "sluice.webhookService" -}}
{{- printf "%s-webhook" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.webhookSecret" -}}
{{- printf "%s-webhook-tls" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.webhookDNSNames" -}}
{{- $service := include "sluice.webhookService" . }}
{{- toJson (list (printf "%s.%s.svc" $service .Release.Namespace) (printf "%s.%s.svc.cluster.local" $service .Release.Namespace)) }}
{{- end }}

{{/* Where the operator reads the webhook's certificate (tls.crt, tls.key). */}}
{{- define "sluice.webhookCertDir" -}}
/etc/sluice-webhook
{{- end }}

{{/* Namespaces outside watchNamespaces where the operator only manages KafkaTopics. */}}
{{- define "sluice.topicNamespaces" -}}
{{- $extra := .Values.kafkaTopicNamespaces }}
{{- if .Values.kafkaCluster.enabled }}{{ $extra = append $extra .Release.Namespace }}{{ end }}
{{- $out := list }}
{{- range uniq $extra }}{{ if not (has . $.Values.watchNamespaces) }}{{ $out = append $out . }}{{ end }}{{ end }}
{{- toJson $out }}
{{- end }}

{{/* The ClusterRoles the operator binds but does not hold (it holds `bind` on them): the Spark driver's
rights, bound to each app's driver account; and the operator's own rights in a namespace with apps. */}}
{{- define "sluice.driverClusterRole" -}}
{{- printf "%s-spark-driver" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.appNamespaceClusterRole" -}}
{{- printf "%s-app-namespace" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* What Spark's driver does in its namespace (spark-submit's and the driver's Kubernetes client): its
executor pods, their headless Service, its ConfigMaps and, with on-demand claims, PersistentVolumeClaims. */}}
{{- define "sluice.driverRules" -}}
- apiGroups: [""]
  resources: [pods]
  verbs: [create, get, list, watch, delete, deletecollection, patch]
- apiGroups: [""]
  resources: [services]
  verbs: [create, get, list, watch, delete]
- apiGroups: [""]
  resources: [configmaps, persistentvolumeclaims]
  verbs: [create, get, list, watch, delete, deletecollection]
{{- end }}

{{/*
What the operator does wherever it watches apps, namespace or not (operator/sluice/operator: handlers,
reconciler, children): the apps themselves, the watches of their children (reads only, filtered by label),
events, and the RoleBindings it makes (each app's driver binding; its own in a namespace with apps), which
it may only point at the two ClusterRoles above. Children are written with server-side apply, which needs
patch, and create for a child that does not exist yet.
*/}}
{{- define "sluice.namespacedRules" -}}
# kopf watches the apps and keeps its progress and finalizer on them; the handlers patch the status.
- apiGroups: [sluice.dev]
  resources: [streamingapps]
  verbs: [get, list, watch, patch]
- apiGroups: [sluice.dev]
  resources: [streamingapps/status]
  verbs: [patch]
# Children are owned by their app with blockOwnerDeletion (OwnerReferencesPermissionEnforcement).
- apiGroups: [sluice.dev]
  resources: [streamingapps/finalizers]
  verbs: [update]
# kopf posts events (e.g. InvalidSpec warnings).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# The watches of the children: a hand edit or deletion is repaired.
- apiGroups: [""]
  resources: [configmaps, services, serviceaccounts]
  verbs: [list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch]
- apiGroups: [sparkoperator.k8s.io]
  resources: [sparkapplications]
  verbs: [list, watch]
# Each app's driver binding, and the operator's own in a namespace with apps (roleRef cannot change: a
# binding made by an older release is deleted and made again).
- apiGroups: [rbac.authorization.k8s.io]
  resources: [rolebindings]
  verbs: [create, patch, list, watch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [clusterroles]
  verbs: [bind]
  resourceNames: [{{ include "sluice.driverClusterRole" . }}, {{ include "sluice.appNamespaceClusterRole" . }}]
{{ include "sluice.kafkaTopicRules" . }}
{{- if and (include "sluice.ha" .) .Values.watchNamespaces }}
{{ include "sluice.peeringRules" (dict "resource" "kopfpeerings") }}
{{- end }}
{{- end }}

{{/* What the operator does in a namespace where apps run, granted there only (it binds this role to itself
when it first handles an app of the namespace; with watchNamespaces, the chart binds it). */}}
{{- define "sluice.appNamespaceRules" -}}
# The driver's ServiceAccount, the revision and runner ConfigMaps (applied, read for a rollout's diff base,
# pruned), the driver Service, the checkpoint claim.
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [create, patch]
- apiGroups: [""]
  resources: [configmaps, services]
  verbs: [create, get, patch, delete]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [create, get, patch]
# The driver pod: read for its address and termination message; deleted when it read a stale config.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, delete]
# The control API's token (made once per app) and the Kafka credentials spec.kafka names: read, never listed.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
# Each driver admits its control port only from the operator's pods.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, patch]
# The driver itself: applied, read for its state, deleted on suspend.
- apiGroups: [sparkoperator.k8s.io]
  resources: [sparkapplications]
  verbs: [get, create, patch, delete]
{{- end }}

{{- define "sluice.kafkaTopicRules" -}}
# Topics managed by Strimzi: applied and read (partitions only grow); a cluster's listener addresses read from
# its Kafka resource's status.
- apiGroups: [kafka.strimzi.io]
  resources: [kafkatopics]
  verbs: [get, create, patch]
- apiGroups: [kafka.strimzi.io]
  resources: [kafkas]
  verbs: [get]
{{- end }}

{{/* kopf peering: the operator creates the peering object once, watches it and patches its presence. */}}
{{- define "sluice.peeringRules" -}}
- apiGroups: [kopf.dev]
  resources: [{{ .resource }}]
  verbs: [create, list, watch, patch]
{{- end }}

{{/* Cluster-scoped reads kopf needs: CRDs (to notice resources come and go) and, when it watches a
namespace list, the namespaces; with crds.upgrade, get and patch of the StreamingApp CRD. */}}
{{- define "sluice.clusterRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if .Values.crds.upgrade }}
# Its own CRD brought up to the operator's release at start (crds.upgrade).
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, patch]
  resourceNames: [streamingapps.sluice.dev]
{{- end }}
{{- if .Values.watchNamespaces }}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- else if include "sluice.ha" . }}
{{ include "sluice.peeringRules" (dict "resource" "clusterkopfpeerings") }}
{{- end }}
{{- end }}

{{- define "sluice.subject" -}}
- kind: ServiceAccount
  name: {{ include "sluice.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}
