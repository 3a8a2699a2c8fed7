{{/* The chart's name, cut to the 63 characters a label value allows. */}}
{{- define "sequenced.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The name of the release's objects: the release name when it already contains the chart's name
(`helm install sequenced ...` gives `sequenced`), else RELEASE-CHART.
*/}}
{{- define "sequenced.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sequenced.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "sequenced.labels" -}}
helm.sh/chart: {{ include "sequenced.chart" . }}
{{ include "sequenced.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the operator's pods; they never change after the first install. */}}
{{- define "sequenced.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sequenced.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sequenced.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sequenced.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The subjects of the RBAC bindings: the controller's service account. */}}
{{- define "sequenced.subjects" -}}
- kind: ServiceAccount
  name: {{ include "sequenced.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}

{{- define "sequenced.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The ServiceAccount a release without spec.serviceAccountName acts as; empty: the controller. */}}
{{- define "sequenced.defaultServiceAccount" -}}
{{- .Values.tenancy.defaultServiceAccount | default (ternary "default" "" .Values.tenancy.multiTenant) -}}
{{- end }}

{{/* "true" when releases may not refer outside their namespace; empty otherwise. */}}
{{- define "sequenced.noCrossNamespaceRefs" -}}
{{- if kindIs "bool" .Values.tenancy.noCrossNamespaceRefs -}}
{{- if .Values.tenancy.noCrossNamespaceRefs }}true{{ end -}}
{{- else if .Values.tenancy.multiTenant -}}
true
{{- end -}}
{{- end }}

{{/* "true" when the ValidatingAdmissionPolicy of the release records is installed; empty otherwise. */}}
{{- define "sequenced.recordPolicy" -}}
{{- if kindIs "bool" .Values.tenancy.recordPolicy -}}
{{- if .Values.tenancy.recordPolicy }}true{{ end -}}
{{- else if .Values.tenancy.multiTenant -}}
true
{{- end -}}
{{- end }}

{{/*
What the controller may write with its own rights: everything, restricted or custom
(rbac.manageEverything: false, from before profiles, is custom).
*/}}
{{- define "sequenced.rbacProfile" -}}
{{- if and (eq .Values.rbac.profile "everything") (not .Values.rbac.manageEverything) -}}
custom
{{- else -}}
{{- .Values.rbac.profile -}}
{{- end -}}
{{- end }}

{{/*
A size as --chart-cache-size reads it (512Mi, 2G, 1048576) in bytes; empty for what is not
written that way (a Kubernetes quantity such as 1.5Gi).
*/}}
{{- define "sequenced.bytes" -}}
{{- $text := toString . -}}
{{- if regexMatch "^[0-9]+(k|M|G|T|Ki|Mi|Gi|Ti)?$" $text -}}
{{- $units := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- $number := regexFind "^[0-9]+" $text -}}
{{- mul (atoi $number) (get $units (trimPrefix $number $text)) -}}
{{- end -}}
{{- end }}
