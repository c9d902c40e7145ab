{{/* Labels on every object: the same app.kubernetes.io/name as deploy/, plus Helm's own. */}}
{{- define "dispatch.labels" -}}
app.kubernetes.io/name: dispatch
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The Deployment's selector; fixed, as in deploy/, so the chart can take over a kustomize install. */}}
{{- define "dispatch.selector" -}}
app.kubernetes.io/name: dispatch
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

