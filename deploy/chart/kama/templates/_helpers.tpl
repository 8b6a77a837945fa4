{{/* Names, labels, images and the environment every Kama process reads. */}}

{{- define "kama.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kama.labels" -}}
app.kubernetes.io/name: kama
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kama
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: (dict "root" $ "component" "worker") */}}
{{- define "kama.selector" -}}
app.kubernetes.io/name: kama
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kama.componentLabels" -}}
{{ include "kama.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* registry/repository:tag or registry/repository@digest: (dict "root" $ "image" .Values.images.kama) */}}
{{- define "kama.image" -}}
{{- $registry := .root.Values.image.registry | trimSuffix "/" -}}
{{- $repo := ternary .image.repository (printf "%s/%s" $registry .image.repository) (empty $registry) -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "kama.namespaced" -}}
{{- if .Values.watchNamespaces }}true{{ end -}}
{{- end -}}

{{- define "kama.temporalService" -}}
{{- printf "%s-temporal" (include "kama.fullname" .) -}}
{{- end -}}

{{- define "kama.temporalAddress" -}}
{{- if .Values.temporal.address -}}
{{- .Values.temporal.address -}}
{{- else if .Values.temporal.evaluation.enabled -}}
{{- printf "%s.%s.svc:7233" (include "kama.temporalService" .) .Release.Namespace -}}
{{- else -}}
{{- fail "temporal.address is required (or set temporal.evaluation.enabled=true for an in-cluster dev server)" -}}
{{- end -}}
{{- end -}}

{{- define "kama.serviceAccount" -}}
{{- printf "%s-%s" (include "kama.fullname" .root) .component -}}
{{- end -}}

{{/* POD_IP from the downward API: servers bind it when listenOnPodIP */}}
{{- define "kama.podIPEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end -}}

{{- define "kama.listenHost" -}}
{{- if .Values.listenOnPodIP }}$(POD_IP){{ else }}0.0.0.0{{ end -}}
{{- end -}}

{{/*
The environment of Kama's processes: Kama's own KAMA_* settings (kama/config.py) and
Temporal's standard TEMPORAL_* client variables (address, namespace, API key, TLS files)
that every Temporal SDK's environment configuration reads.
*/}}
{{- define "kama.env" -}}
{{- $temporal := include "kama.temporalAddress" . -}}
{{ include "kama.tmpEnv" . }}
- name: KAMA_TEMPORAL_ADDRESS
  value: {{ $temporal | quote }}
- name: KAMA_TEMPORAL_NAMESPACE
  value: {{ .Values.temporal.namespace | quote }}
- name: TEMPORAL_ADDRESS
  value: {{ $temporal | quote }}
- name: TEMPORAL_NAMESPACE
  value: {{ .Values.temporal.namespace | quote }}
{{- if .Values.temporal.tls.enabled }}
- name: TEMPORAL_TLS
  value: "true"
{{- if .Values.temporal.tls.secretName }}
- name: TEMPORAL_TLS_CLIENT_CERT_PATH
  value: /etc/kama/temporal-tls/tls.crt
- name: TEMPORAL_TLS_CLIENT_KEY_PATH
  value: /etc/kama/temporal-tls/tls.key
- name: TEMPORAL_TLS_SERVER_CA_CERT_PATH
  value: /etc/kama/temporal-tls/ca.crt
{{- end }}
{{- if .Values.temporal.tls.serverName }}
- name: TEMPORAL_TLS_SERVER_NAME
  value: {{ .Values.temporal.tls.serverName | quote }}
{{- end }}
{{- end }}
{{- if .Values.temporal.apiKey.secretName }}
- name: TEMPORAL_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.temporal.apiKey.secretName }}
      key: {{ .Values.temporal.apiKey.key }}
{{- end }}
- name: KAMA_CONTROL_QUEUE
  value: {{ .Values.controlQueue | quote }}
- name: KAMA_CLUSTER
  value: {{ .Values.clusterName | quote }}
- name: KAMA_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
{{- /* the watcher puts the runtime image into each deployment workflow's input, the
worker the importer image into importer pods: every process gets both */}}
- name: KAMA_IMPORTER_IMAGE
  value: {{ include "kama.image" (dict "root" . "image" .Values.images.kama) | quote }}
- name: KAMA_RUNTIME_IMAGE
  value: {{ include "kama.image" (dict "root" . "image" .Values.images.llamaServer) | quote }}
- name: KAMA_ALLOWED_RUNTIME_IMAGES
  value: {{ join "," .Values.admissionPolicy.extraImages | quote }}
- name: KAMA_ALLOWED_NODE_SELECTOR_KEYS
  value: {{ join "," .Values.tenancy.allowedNodeSelectorKeys | quote }}
- name: KAMA_ALLOWED_TOLERATION_KEYS
  value: {{ join "," .Values.tenancy.allowedTolerationKeys | quote }}
{{- with .Values.watchNamespaces }}
- name: KAMA_WATCH_NAMESPACE
  value: {{ join "," . | quote }}
{{- end }}
{{- end -}}

{{/*
The root filesystem is read-only; an emptyDir at /var/tmp (not /tmp: the local stack's
process node keeps every pod's volume sources under /tmp) is the scratch space.
*/}}
{{/*
The worker's and the watcher's Prometheus ports: (dict "root" $ "values" .Values.worker).
Kama's own metrics on `metrics`, the Temporal SDK's on `sdk-metrics`; a port of 0 is off.
*/}}
{{- define "kama.metricsEnv" -}}
- name: KAMA_METRICS_PORT
  value: {{ .values.metricsPort | quote }}
- name: KAMA_TEMPORAL_METRICS_PORT
  value: {{ .values.temporalMetricsPort | quote }}
{{- end -}}
{{- define "kama.metricsPorts" -}}
{{- if .values.metricsPort }}
- name: metrics
  containerPort: {{ .values.metricsPort }}
{{- end }}
{{- if .values.temporalMetricsPort }}
- name: sdk-metrics
  containerPort: {{ .values.temporalMetricsPort }}
{{- end }}
{{- end -}}
{{- define "kama.tmpEnv" -}}
- name: TMPDIR
  value: /var/tmp
{{- end -}}

{{- define "kama.temporalVolume" -}}
{{- if and .Values.temporal.tls.enabled .Values.temporal.tls.secretName }}
- name: temporal-tls
  secret:
    secretName: {{ .Values.temporal.tls.secretName }}
    optional: false
{{- end }}
{{- end -}}

{{- define "kama.temporalMount" -}}
{{- if and .Values.temporal.tls.enabled .Values.temporal.tls.secretName }}
- name: temporal-tls
  mountPath: /etc/kama/temporal-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* the pod spec parts every Kama Deployment shares: (dict "root" $ "component" "worker" "values" .Values.worker) */}}
{{- define "kama.podCommon" -}}
serviceAccountName: {{ include "kama.serviceAccount" . }}
{{- with .root.Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
