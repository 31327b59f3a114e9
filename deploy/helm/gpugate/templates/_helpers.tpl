{{/* gpugate's namespace: the value, or the release's where it is "". */}}
{{- define "gpugate.namespace" -}}
{{- .Values.namespace | default .Release.Namespace -}}
{{- end -}}

{{/* The image every workload runs: by digest where one is given, else by tag (the chart's appVersion by default). */}}
{{- define "gpugate.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- end -}}
{{- end -}}
