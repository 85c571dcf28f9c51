{{/* Names: "<release>" when it already says vgpud, else "<release>-vgpud". */}}
{{- define "vgpud.fullname" -}}
{{- if contains "vgpud" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-vgpud" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "vgpud.scheduler" -}}{{ include "vgpud.fullname" . }}-scheduler{{- end -}}
{{- define "vgpud.plugin" -}}{{ include "vgpud.fullname" . }}-plugin{{- end -}}
{{- define "vgpud.settings" -}}{{ include "vgpud.fullname" . }}-settings{{- end -}}

{{- define "vgpud.selectorLabels" -}}
app.kubernetes.io/name: vgpud
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vgpud.labels" -}}
{{ include "vgpud.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "vgpud.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* kube-scheduler's tag: the value, else the cluster's vX.Y.Z (registry.k8s.io tags every patch release). */}}
{{- define "vgpud.kubeSchedulerImage" -}}
{{- $ks := .Values.scheduler.kubeScheduler.image -}}
{{- $tag := $ks.tag | default (regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version) -}}
{{ $ks.repository }}:{{ $tag }}
{{- end -}}

{{/* Where both roles read the settings file. */}}
{{- define "vgpud.settingsDir" -}}/etc/vgpud-settings{{- end -}}
{{- define "vgpud.settingsFile" -}}{{ include "vgpud.settingsDir" . }}/vgpud.yaml{{- end -}}

{{/* The plugin's metrics port, from config.plugin.metricsListen (HOST:PORT). */}}
{{- define "vgpud.pluginMetricsPort" -}}
{{- splitList ":" .Values.config.plugin.metricsListen | last -}}
{{- end -}}

{{/* Lease names: kube-scheduler's (its own, never the main scheduler's "kube-scheduler")
     and the extender's (vgpud/extender/run.py run_scheduler lease_name). */}}
{{- define "vgpud.kubeSchedulerLease" -}}{{ .Values.config.schedulerName }}{{- end -}}
{{- define "vgpud.extenderLease" -}}vgpud-scheduler{{- end -}}

{{- define "vgpud.checks" -}}
{{- if ne .Values.config.resourcePreset "vgpu-manager" -}}
{{- fail "config.resourcePreset: the device plugin advertises nvidia.com/vgpu-number, so the chart supports only resourcePreset=vgpu-manager" -}}
{{- end -}}
{{- if and (gt (int .Values.scheduler.replicas) 1) (not .Values.scheduler.leaderElect) -}}
{{- fail "scheduler.replicas > 1 needs scheduler.leaderElect=true: without it every replica schedules" -}}
{{- end -}}
{{- if eq .Values.config.schedulerName "default-scheduler" -}}
{{- fail "config.schedulerName must not be default-scheduler: vgpud runs as a second scheduler" -}}
{{- end -}}
{{- end -}}
