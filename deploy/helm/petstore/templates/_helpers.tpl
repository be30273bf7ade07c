{{- define "petstore.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "petstore.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "petstore.selectorLabels" -}}
app.kubernetes.io/name: {{ include "petstore.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "petstore.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "petstore.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "petstore.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The Secret the pods read: the user's, or the chart's. */}}
{{- define "petstore.secretName" -}}
{{- default (include "petstore.fullname" .) .Values.secret.existingSecret -}}
{{- end -}}

{{/* The Secret's entries that are set (all of them for an existing Secret: optional refs). */}}
{{- define "petstore.secretData" -}}
{{- $s := .Values.secret -}}
{{- $data := dict -}}
{{- range $key, $value := dict "API_KEYS" $s.apiKeys "API_KEY_SHA256" $s.apiKeySha256 "DATABASE_URL" $s.databaseUrl "DATABASE_DIRECT_URL" $s.databaseDirectUrl "REDIS_URL" $s.redisUrl -}}
{{- if $value }}{{ $_ := set $data $key $value }}{{ end -}}
{{- end -}}
{{- toYaml $data -}}
{{- end -}}

{{/*
Environment from a Secret. Every reference is optional: a Secret that lacks DATABASE_URL or
every key set then starts the process, which exits 1 naming what is missing (a required
reference would leave the pod, and the migration hook, waiting in CreateContainerConfigError).
*/}}
{{- define "petstore.secretEnv" -}}
{{- $name := index . 0 -}}
{{- range $key := list "DATABASE_URL" "DATABASE_DIRECT_URL" "API_KEYS" "API_KEY_SHA256" "REDIS_URL" }}
- name: {{ $key }}
  valueFrom:
    secretKeyRef:
      name: {{ $name }}
      key: {{ $key }}
      optional: true
{{- end }}
{{- end -}}

{{/* Pod-level security: what test:container runs the image with (uid/gid 1000 = the image's `node`). */}}
{{- define "petstore.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 1000
runAsGroup: 1000
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* --read-only --cap-drop=ALL --security-opt=no-new-privileges, as a container securityContext. */}}
{{- define "petstore.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 1000
runAsGroup: 1000
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The grace period must cover the drain and the close, with a margin for the kubelet's own latency. */}}
{{- define "petstore.checkGrace" -}}
{{- $needed := add (div (add .Values.config.shutdownDrainMs .Values.config.shutdownTimeoutMs 999) 1000) 5 -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (int $needed) -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed (config.shutdownDrainMs + config.shutdownTimeoutMs) / 1000 + 5 s = %v s, or pods are killed before they close" .Values.terminationGracePeriodSeconds $needed) -}}
{{- end -}}
{{- end -}}

{{/* The tracing values as the standard OTEL_* variables the SDK reads (empty ones are left out). */}}
{{- define "petstore.tracingEnv" -}}
{{- $t := .Values.tracing -}}
OTEL_EXPORTER_OTLP_ENDPOINT: {{ $t.endpoint | quote }}
OTEL_EXPORTER_OTLP_PROTOCOL: {{ $t.protocol | quote }}
OTEL_SERVICE_NAME: {{ $t.serviceName | quote }}
OTEL_TRACES_SAMPLER: {{ $t.sampler | quote }}
OTEL_TRACES_SAMPLER_ARG: {{ $t.samplerArg | toString | quote }}
OTEL_RESOURCE_ATTRIBUTES: {{ $t.resourceAttributes | quote }}
{{- end -}}

{{/* The SDK starts only under --import ./dist/telemetry.js: args without it would silently trace nothing. */}}
{{- define "petstore.checkTracingArgs" -}}
{{- if and .Values.tracing.endpoint .Values.args (not (or (has "./dist/telemetry.js" .Values.args) (has "--import=./dist/telemetry.js" .Values.args))) -}}
{{- fail "tracing.endpoint is set but args leave out \"--import\", \"./dist/telemetry.js\": the tracing SDK would never start; add them before dist/server.js" -}}
{{- end -}}
{{- end -}}
