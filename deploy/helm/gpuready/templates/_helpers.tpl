{{/* Names and labels shared by every template. */}}

{{- define "gpuready.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuready.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpuready.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpuready.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gpuready.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuready.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpuready.pluginName" -}}{{ include "gpuready.fullname" . | trunc 48 | trimSuffix "-" }}-kubelet-plugin{{- end -}}
{{- define "gpuready.controllerName" -}}{{ include "gpuready.fullname" . | trunc 52 | trimSuffix "-" }}-controller{{- end -}}
{{- define "gpuready.webhookName" -}}{{ include "gpuready.fullname" . | trunc 55 | trimSuffix "-" }}-webhook{{- end -}}

{{/* simulated.enabled runs the test-only tag (the simulated NVML is only there) unless a tag is set. */}}
{{- define "gpuready.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default (printf "%s%s" .Chart.AppVersion (ternary "-testbed" "" .Values.simulated.enabled)) }}
{{- end -}}

{{/* "true" when the plugin runs the simulated NVML (simulated.enabled, or nvml.source alone). */}}
{{- define "gpuready.simulatedNvmlOn" -}}
{{- if or .Values.simulated.enabled (eq .Values.nvml.source "simulated") }}true{{ end -}}
{{- end -}}

{{/* The driver root on the host: the chart's fake one under simulated.enabled, else driverRoot. */}}
{{- define "gpuready.hostDriverRoot" -}}
{{- if .Values.simulated.enabled -}}
{{ trimSuffix "/" .Values.simulated.hostDirectory }}/driver-root
{{- else -}}
{{ .Values.driverRoot }}
{{- end -}}
{{- end -}}

{{/* The domain after the first label of the driver name: gpu.nvidia.com -> nvidia.com. */}}
{{- define "gpuready.driverDomain" -}}
{{- $parts := splitList "." .Values.driverName -}}
{{- if gt (len $parts) 2 -}}{{ rest $parts | join "." }}{{- else -}}{{ .Values.driverName }}{{- end -}}
{{- end -}}

{{- define "gpuready.gpuClassName" -}}
{{- .Values.deviceClasses.gpuClassName | default .Values.driverName -}}
{{- end -}}

{{- define "gpuready.migClassName" -}}
{{- .Values.deviceClasses.migClassName | default (printf "mig.%s" (include "gpuready.driverDomain" .)) -}}
{{- end -}}

{{- define "gpuready.vramClassName" -}}
{{- .Values.deviceClasses.vramClassName | default (printf "vram.%s" .Values.driverName) -}}
{{- end -}}

{{/* The plugin's own directory on the host (and, at the same path, in the container). */}}
{{- define "gpuready.pluginDir" -}}
{{- printf "%s/%s" (.Values.kubeletPlugin.pluginsDirectoryPath | trimSuffix "/") .Values.driverName -}}
{{- end -}}

{{/* auto|true|false for objects of the Prometheus Operator. */}}
{{- define "gpuready.monitoringOn" -}}
{{- $v := index . 0 -}}{{- $ctx := index . 1 -}}
{{- if eq (toString $v) "true" -}}true
{{- else if and (eq (toString $v) "auto") ($ctx.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") -}}true
{{- end -}}
{{- end -}}

{{- define "gpuready.pluginServiceAccount" -}}{{ include "gpuready.pluginName" . }}{{- end -}}
{{- define "gpuready.controllerServiceAccount" -}}{{ include "gpuready.controllerName" . }}{{- end -}}

{{/* SHARED_GPUS for the plugin: "" (none), "all", or a comma list of device names. */}}
{{- define "gpuready.sharedGpus" -}}
{{- $v := .Values.sharedGpus -}}
{{- if kindIs "slice" $v -}}{{ join "," $v }}{{- else if $v -}}all{{- end -}}
{{- end -}}

{{/* A share mode as the plugin reads it: a number unquoted in YAML comes as a float ("1e+06" with %v). */}}
{{- define "gpuready.shareModeText" -}}
{{- if kindIs "string" . }}{{ . }}{{ else }}{{ int64 . }}{{ end -}}
{{- end -}}

{{/* GPU_SHARE_MODES for the plugin: gpuShareModes as "gpu-0=4,gpu-1=unlimited" (sorted by name). */}}
{{- define "gpuready.gpuShareModes" -}}
{{- $out := list -}}
{{- range $name, $mode := .Values.gpuShareModes -}}
{{- $out = append $out (printf "%s=%s" $name (include "gpuready.shareModeText" $mode)) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* controller.placementMode as "off" or "gated" (YAML 1.1 reads an unquoted off as false). */}}
{{- define "gpuready.placementMode" -}}
{{- if eq (toString .Values.controller.placementMode) "gated" }}gated{{ else }}off{{ end -}}
{{- end -}}

{{/* readinessTaint.mode: an unquoted off in YAML is false, taken as off. */}}
{{- define "gpuready.readinessTaintMode" -}}
{{- $m := toString .Values.readinessTaint.mode }}{{ if has $m (list "bootstrap-only" "continuous") }}{{ $m }}{{ else }}off{{ end -}}
{{- end -}}

{{/* The simulated NVML's spec: the profile, seeded with the node's name unless it names a seed itself. */}}
{{- define "gpuready.simulatedNvml" -}}
{{- if contains "@" .Values.nvml.simulatedProfile -}}
sim:{{ .Values.nvml.simulatedProfile }}
{{- else -}}
sim:{{ .Values.nvml.simulatedProfile }}@$(NODE_NAME)
{{- end -}}
{{- end }}
