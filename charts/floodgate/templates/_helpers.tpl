{{/*
The labels every object carries: the base's own and kustomize's `part-of`. No Helm labels, so
that the default values render exactly the kustomize base (link-crd/tests/chart.rs).
*/}}
{{- define "floodgate.labels" -}}
app.kubernetes.io/name: floodgate
app.kubernetes.io/part-of: floodgate
{{- end }}

{{/*
The labels the pods carry and the Services, the NetworkPolicy and the PodDisruptionBudget
select on.
*/}}
{{- define "floodgate.selectorLabels" -}}
app.kubernetes.io/name: floodgate
{{- end }}

{{- define "floodgate.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
Refuses values that would hurt: the chart owns the namespaces it creates (deletes them on
uninstall), so never a shared one; and the credentials namespace, whose every Secret the gateway
can read, is never the namespace that holds the admin token and the TLS key.
*/}}
{{- define "floodgate.checks" -}}
{{- $ns := .Release.Namespace }}
{{- $creds := .Values.credentials.namespace }}
{{- if and .Values.createNamespace (include "floodgate.shared" $ns) }}
{{- fail (printf "the chart would label and own the namespace %q (createNamespace): install it in a namespace of its own (-n floodgate --create-namespace), or set createNamespace=false" $ns) }}
{{- end }}
{{- if and .Values.credentials.createNamespace (include "floodgate.shared" $creds) }}
{{- fail (printf "the chart would own the namespace %q (credentials.createNamespace): give the links' Secrets a namespace of their own, or set credentials.createNamespace=false" $creds) }}
{{- end }}
{{- if eq $creds $ns }}
{{- fail (printf "credentials.namespace is the release's namespace %q: the gateway can read every Secret of the credentials namespace, the admin token and the TLS key included; give the links' Secrets a namespace of their own" $ns) }}
{{- end }}
{{- end }}

{{/* Non-empty when the namespace is one a cluster shares: `default` and `kube-*`. */}}
{{- define "floodgate.shared" -}}
{{- if or (eq . "default") (hasPrefix "kube-" .) }}shared{{ end }}
{{- end }}
