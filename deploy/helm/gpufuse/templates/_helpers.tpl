{{- define "gpufuse.name" -}}gpufuse{{- end -}}

{{- define "gpufuse.fullname" -}}
{{- if contains "gpufuse" .Release.Name -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}{{- else -}}{{ printf "%s-gpufuse" .Release.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "gpufuse.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}

{{- define "gpufuse.labels" -}}
app.kubernetes.io/name: gpufuse
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gpufuse.selector" -}}
app.kubernetes.io/name: gpufuse
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
