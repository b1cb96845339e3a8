{{/* The image of eerld's own containers: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "eerld.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The labels every object carries. */}}
{{- define "eerld.labels" -}}
app.kubernetes.io/name: eerld
app.kubernetes.io/part-of: eerl
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "eerld.selector" -}}
app.kubernetes.io/name: eerld
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
