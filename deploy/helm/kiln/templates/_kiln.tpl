{{- /* kiln's own image (operator, hook Jobs): kiln.repository/kiln.image:kiln.version, the
version defaulting to the chart's appVersion. */ -}}
{{- define "kiln.image" -}}
{{ .Values.kiln.repository }}/{{ .Values.kiln.image }}:{{ .Values.kiln.version | default .Chart.AppVersion }}
{{- end -}}

{{- /* The pod settings the hook Jobs share with the operator: scheduling, pull secrets and a
non-root, read-only container (kiln's `nonroot` uid 65532). Call with (list $ "<container name>"
(list args...)). */ -}}
{{- define "kiln.hookPod" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $args := index . 2 -}}
restartPolicy: OnFailure
serviceAccountName: {{ $name }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile: {type: RuntimeDefault}
{{- with $root.Values.operator.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- with $root.Values.operator.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.operator.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - name: {{ $name }}
    image: {{ include "kiln.image" $root | quote }}
    imagePullPolicy: {{ $root.Values.operator.imagePullPolicy }}
    args: {{ toJson $args }}
    env:
      - name: KILN_LOG
        value: {{ $root.Values.operator.logging.level | quote }}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      runAsNonRoot: true
      privileged: false
      capabilities: {drop: [ALL]}
      seccompProfile: {type: RuntimeDefault}
{{- end -}}
