{{/* Labels on every object. */}}
{{- define "axon.labels" -}}
app.kubernetes.io/part-of: axon
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The image reference: repository@digest when a digest is set, else repository:tag (tag defaults to appVersion). */}}
{{- define "axon.image" -}}
{{- if .Values.image.digest -}}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" .Values.image.digest) -}}
{{- fail (printf "image.digest %q is not sha256:<64 hex digits>" .Values.image.digest) -}}
{{- end -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion | toString -}}
{{- if eq $tag "latest" -}}
{{- fail "image.tag latest is refused: pin a version (image.tag) or a digest (image.digest)" -}}
{{- end -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end }}

{{/* A flag value for the agent's ConfigMap: whole numbers without exponent (YAML numbers arrive as float64). */}}
{{- define "axon.flagValue" -}}
{{- if kindIs "float64" . -}}
{{- if ne (float64 (int64 .)) . -}}
{{- fail (printf "agent value %v is not a whole number: no axon-agent flag takes fractions" .) -}}
{{- end -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end }}
