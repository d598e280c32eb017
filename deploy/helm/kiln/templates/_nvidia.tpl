{{- /*
The NVIDIA GPU Operator release whose values and ClusterPolicy kiln's chart follows. NVIDIA's chart
tags the images it builds itself (validator, node status exporter: nvcr.io/nvidia/gpu-operator)
with its own appVersion when `version` is left out, as NVIDIA's values.yaml does; kiln's chart
does the same with this version, so NVIDIA's values.yaml works unchanged.
*/ -}}
{{- define "kiln.nvidiaAppVersion" -}}v26.7.0{{- end -}}

{{- /*
A component block of the ClusterPolicy (`validator`, `nodeStatusExporter`) whose version defaults
to "kiln.nvidiaAppVersion" when an image is named without one (kiln's own image, used when
repository and image are empty, needs no version). Call with (list $ "<key>").
*/ -}}
{{- define "kiln.nvidiaImageComponent" -}}
{{- $root := index . 0 -}}
{{- $c := index $root.Values (index . 1) | default dict -}}
{{- $rest := omit $c "version" -}}
{{- /* Empty strings mean "kiln's own image": leave them out (the CRD's patterns refuse ""). */ -}}
{{- range $k := list "repository" "image" }}{{ if not (index $rest $k) }}{{ $_ := unset $rest $k }}{{ end }}{{ end -}}
{{- if $rest }}{{ toYaml $rest }}{{ end }}
{{- if $c.version }}
version: {{ $c.version | quote }}
{{- else if $c.image }}
version: {{ include "kiln.nvidiaAppVersion" $root | quote }}
{{- end }}
{{- end -}}
