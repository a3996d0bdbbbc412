{{- define "kubeinfer.name" -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kubeinfer.labels" -}}
app.kubernetes.io/name: kubeinfer-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kubeinfer.selector" -}}
app.kubernetes.io/name: kubeinfer-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kubeinfer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kubeinfer.name" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kubeinfer.routerClusterRole" -}}
{{- printf "%s-router" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
