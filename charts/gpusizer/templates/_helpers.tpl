{{/* Name of the objects: the release name when it already says gpusizer. */}}
{{- define "gpusizer.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the operator's pods: stable across upgrades. */}}
{{- define "gpusizer.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels that select the activator's pods: a name of their own, so the operator's
Deployment and metrics Service, which select by the chart's name, never match them. */}}
{{- define "gpusizer.activatorSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-activator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: activator
{{- end -}}

{{/* Labels on every object. helm.sh/chart and managed-by are the only Helm-specific ones
(the plain manifests in deploy/ carry the rest). */}}
{{- define "gpusizer.labels" -}}
{{ include "gpusizer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: gpusizer
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gpusizer.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
