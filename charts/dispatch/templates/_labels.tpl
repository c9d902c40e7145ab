{{/* app.kubernetes.io/name of every object: "dispatch" (as deploy/) unless nameOverride. */}}
{{- define "dispatch.name" -}}
{{- .Values.nameOverride | default "dispatch" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of the release's namespaced objects' names: "dispatch" (as deploy/) unless fullnameOverride. */}}
{{- define "dispatch.fullname" -}}
{{- .Values.fullnameOverride | default "dispatch" | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object: the same app.kubernetes.io/name as deploy/, plus Helm's own and commonLabels. */}}
{{- define "dispatch.labels" -}}
app.kubernetes.io/name: {{ include "dispatch.name" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The Deployment's selector; fixed, as in deploy/, so the chart can take over a kustomize install. */}}
{{- define "dispatch.selector" -}}
app.kubernetes.io/name: {{ include "dispatch.name" . }}
app.kubernetes.io/component: admission-controller
{{- end -}}

{{/* registry/repository, then @digest when one is given (it pins the bytes), else :tag (default appVersion). */}}
{{- define "dispatch.image" -}}
{{- $repo := .Values.image.repository -}}
{{- with .Values.image.registry }}{{ $repo = printf "%s/%s" (trimSuffix "/" .) $repo }}{{ end -}}
{{- if .Values.image.digest -}}
{{ $repo }}@{{ .Values.image.digest }}
{{- else -}}
{{ $repo }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* A cert-manager Issuer reference: the given one, or the chart's self-signed Issuer named $.self. */}}
{{- define "dispatch.issuerRef" -}}
{{- if .ref.name -}}
name: {{ .ref.name }}
kind: {{ .ref.kind | default "Issuer" }}
{{- with .ref.group }}
group: {{ . }}
{{- end }}
{{- else -}}
name: {{ .self }}
kind: Issuer
{{- end -}}
{{- end -}}
