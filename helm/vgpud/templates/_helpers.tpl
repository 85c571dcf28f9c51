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
{{- define "vgpud.dra" -}}{{ include "vgpud.fullname" . }}-dra{{- end -}}
{{- define "vgpud.settings" -}}{{ include "vgpud.fullname" . }}-settings{{- end -}}
{{- define "vgpud.webhook" -}}{{ include "vgpud.fullname" . }}-webhook{{- end -}}
{{/* The Secret with the webhook's serving certificate (bootstrap: the webhook writes it;
     cert-manager: the Certificate does). */}}
{{- define "vgpud.webhookSecret" -}}{{ include "vgpud.webhook" . }}-tls{{- end -}}

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

{{/* HOST:PORT for a --listen flag from (list address port): an IPv6 address in brackets. */}}
{{- define "vgpud.listen" -}}
{{- $host := index . 0 | toString -}}
{{- if contains ":" $host }}[{{ $host }}]{{ else }}{{ $host }}{{ end }}:{{ index . 1 }}
{{- end -}}

{{/* Where the ops token Secret (opsAuth) is mounted, and the file config.ops.tokenFile names. */}}
{{- define "vgpud.opsAuthDir" -}}/etc/vgpud-ops-auth{{- end -}}
{{- define "vgpud.opsTokenFile" -}}{{ include "vgpud.opsAuthDir" . }}/{{ .Values.opsAuth.key }}{{- end -}}

{{/* The daemons' settings: the values' config, with the token file of opsAuth. */}}
{{- define "vgpud.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- /* the webhook's DRA translation: off unless DRA is on; the classes are the chart's */ -}}
{{- $translate := ternary .Values.dra.translate "off" .Values.dra.enabled -}}
{{- $_ := set $config "dra" (dict "enabled" .Values.dra.enabled "translate" $translate "vgpuClass" .Values.dra.deviceClasses.vgpu "gpuClass" .Values.dra.deviceClasses.gpu) -}}
{{- if .Values.opsAuth.enabled -}}
{{- $_ := set $config.ops "tokenFile" (include "vgpud.opsTokenFile" .) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The opsAuth Secret's volume and mount (one container of each pod: the vgpud one). The
     mode lets the non-root user read it; no other container mounts it. */}}
{{- define "vgpud.opsAuthMount" -}}
{{- if .Values.opsAuth.enabled }}
- name: ops-auth
  mountPath: {{ include "vgpud.opsAuthDir" . }}
  readOnly: true
{{- end }}
{{- end -}}
{{- define "vgpud.opsAuthVolume" -}}
{{- if .Values.opsAuth.enabled }}
- name: ops-auth
  secret:
    secretName: {{ .Values.opsAuth.existingSecret }}
    items:
      - key: {{ .Values.opsAuth.key }}
        path: {{ .Values.opsAuth.key }}
    defaultMode: 0444
{{- end }}
{{- end -}}

{{/* The plugin's metrics port, from config.plugin.metricsListen (HOST:PORT). */}}
{{- define "vgpud.pluginMetricsPort" -}}
{{- splitList ":" .Values.config.plugin.metricsListen | last -}}
{{- end -}}

{{/* Lease names: kube-scheduler's (its own, never the main scheduler's "kube-scheduler")
     and the extender's (vgpud/extender/run.py run_scheduler lease_name). */}}
{{- define "vgpud.kubeSchedulerLease" -}}{{ .Values.config.schedulerName }}{{- end -}}
{{- define "vgpud.extenderLease" -}}vgpud-scheduler{{- end -}}

{{/* "true" when the extender takes its own Lease: scheduler.extender.leaderElect, or when
     that is unset (null) whenever the scheduler runs more than one replica. */}}
{{- define "vgpud.extenderElects" -}}
{{- $le := .Values.scheduler.extender.leaderElect -}}
{{- if or $le (and (kindIs "invalid" $le) (gt (int .Values.scheduler.replicas) 1)) -}}true{{- end -}}
{{- end -}}

{{/* The resource names of each preset: vgpud/core/requests.py PRESETS, field for field
     (number, memory, cores, memoryPercent, priority; a test compares the two). `number` is
     what the device plugin advertises when the preset is config.resourcePreset. */}}
{{- define "vgpud.presets" -}}
vgpu-manager:
  number: nvidia.com/vgpu-number
  memory: nvidia.com/vgpu-memory
  cores: nvidia.com/vgpu-cores
  memoryPercent: nvidia.com/vgpu-memory-percentage
  mig: nvidia.com/mig-
hami:
  number: nvidia.com/gpu
  memory: nvidia.com/gpumem
  cores: nvidia.com/gpucores
  memoryPercent: nvidia.com/gpumem-percentage
  priority: nvidia.com/priority
  mig: nvidia.com/mig-
volcano:
  number: volcano.sh/vgpu-number
  memory: volcano.sh/vgpu-memory
  cores: volcano.sh/vgpu-cores
  memoryPercent: volcano.sh/vgpu-memory-percentage
tke:
  number: tencent.com/vcuda-core
  memory: tencent.com/vcuda-memory
{{- end -}}

{{/* The presets' table with config.resourceNames applied (vgpud/config.py ResourceNames):
     a preset's `domain` replaces the domain of each of its names (not the MIG prefix),
     then resourceName, resourceMem, resourceCores, resourceMemPercentage and
     resourcePriority replace single names; "" drops one (only the last two may be
     dropped: "vgpud.checks" says so). */}}
{{- define "vgpud.namedPresets" -}}
{{- $presets := include "vgpud.presets" . | fromYaml -}}
{{- $keys := dict "number" "resourceName" "memory" "resourceMem" "cores" "resourceCores" "memoryPercent" "resourceMemPercentage" "priority" "resourcePriority" -}}
{{- range $p, $names := .Values.config.resourceNames | default dict -}}
{{- if and (hasKey $presets $p) (kindIs "map" $names) -}}
{{- $t := get $presets $p -}}
{{- range $field, $key := $keys -}}
{{- $name := get $t $field -}}
{{- if and $names.domain $name -}}
{{- $name = printf "%s/%s" $names.domain (regexReplaceAll "^[^/]*/" $name "") -}}
{{- end -}}
{{- if and (hasKey $names $key) (kindIs "string" (get $names $key)) -}}
{{- $name = get $names $key -}}
{{- end -}}
{{- if $name -}}{{- $_ := set $t $field $name -}}{{- else -}}{{- $_ := unset $t $field -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $presets | toYaml -}}
{{- end -}}

{{/* The enabled presets' names: config.resourcePreset first, then config.compatPresets. */}}
{{- define "vgpud.enabledPresets" -}}
{{- concat (list .Values.config.resourcePreset) (.Values.config.compatPresets | default list) | uniq | toJson -}}
{{- end -}}

{{/* The enabled presets' resource names, in order, each once (JSON list), of the fields
     given: include "vgpud.resourceNames" (dict "ctx" $ "fields" (list "number" ...)). */}}
{{- define "vgpud.resourceNames" -}}
{{- $presets := include "vgpud.namedPresets" .ctx | fromYaml -}}
{{- $names := list -}}
{{- range $p := include "vgpud.enabledPresets" .ctx | fromJsonArray -}}
{{- $t := get $presets $p -}}
{{- range $field := $.fields -}}
{{- with get $t $field -}}{{- $names = append $names . -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end -}}

{{/* Every name a pod may ask for: kube-scheduler's managedResources. */}}
{{- define "vgpud.gpuResourceNames" -}}
{{- include "vgpud.resourceNames" (dict "ctx" . "fields" (list "number" "memory" "cores" "memoryPercent" "priority")) -}}
{{- end -}}

{{/* The enabled presets' MIG resource prefixes (JSON list), each once. */}}
{{- define "vgpud.migPrefixes" -}}
{{- include "vgpud.resourceNames" (dict "ctx" . "fields" (list "mig")) -}}
{{- end -}}

{{/* The MIG profile resources of scheduler.migProfiles under every prefix (JSON list). */}}
{{- define "vgpud.migResourceNames" -}}
{{- $names := list -}}
{{- range $prefix := include "vgpud.migPrefixes" . | fromJsonArray -}}
{{- range $profile := $.Values.scheduler.migProfiles -}}
{{- $names = append $names (printf "%s%s" $prefix $profile) -}}
{{- end -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end -}}

{{/* The names that make a container a GPU container (vgpud/core/requests.py preset_of,
     vgpud/core/admission.py is_gpu_pod): a priority alone does not. */}}
{{- define "vgpud.gpuPodResourceNames" -}}
{{- include "vgpud.resourceNames" (dict "ctx" . "fields" (list "number" "memory" "cores" "memoryPercent")) -}}
{{- end -}}

{{/* The configured preset's table entry (JSON), config.resourceNames applied. */}}
{{- define "vgpud.preset" -}}
{{- get (include "vgpud.namedPresets" . | fromYaml) .Values.config.resourcePreset | toJson -}}
{{- end -}}

{{/* The vgpu-manager preset's entry (JSON), renamed or not: its memory and cores names are
     the node capacity the plugin's MemoryPlugin / CorePlugin gates publish. */}}
{{- define "vgpud.gateNames" -}}
{{- get (include "vgpud.namedPresets" . | fromYaml) "vgpu-manager" | toJson -}}
{{- end -}}

{{/* The webhook's matchConditions expression (CEL): the pod has a container or an init
     container whose resources.limits or resources.requests names a GPU resource of an
     enabled preset (is_gpu_pod in vgpud/core/admission.py, the pods the webhook acts on).
     Only such pods are sent, so a down webhook blocks GPU pods only. */}}
{{- define "vgpud.webhookMatchExpression" -}}
{{- $names := include "vgpud.gpuPodResourceNames" . -}}
{{- $mig := include "vgpud.migPrefixes" . -}}
(object.spec.containers +
  (has(object.spec.initContainers) ? object.spec.initContainers : [])
).exists(c, has(c.resources) && ({{ $names }}.exists(r,
  (has(c.resources.limits) && r in c.resources.limits) ||
  (has(c.resources.requests) && r in c.resources.requests))
{{- if ne $mig "[]" }} || {{ $mig }}.exists(p,
  (has(c.resources.limits) && c.resources.limits.exists(k, k.startsWith(p))) ||
  (has(c.resources.requests) && c.resources.requests.exists(k, k.startsWith(p))))
{{- end -}}
))
{{- end -}}

{{/* Which webhook objects sit where. The label that spares a namespace or a pod. */}}
{{- define "vgpud.webhookOptOutLabel" -}}vgpud.io/webhook{{- end -}}
{{- define "vgpud.webhookTLSDir" -}}/etc/vgpud-webhook-tls{{- end -}}

{{- define "vgpud.checks" -}}
{{- $presets := include "vgpud.presets" . | fromYaml -}}
{{- $known := keys $presets | sortAlpha | join ", " -}}
{{- if not (hasKey $presets (toString .Values.config.resourcePreset)) -}}
{{- fail (printf "config.resourcePreset: unknown preset %q; choose one of %s" (toString .Values.config.resourcePreset) $known) -}}
{{- end -}}
{{- range .Values.config.compatPresets -}}
{{- if not (hasKey $presets (toString .)) -}}
{{- fail (printf "config.compatPresets: unknown preset %q; choose one of %s" (toString .) $known) -}}
{{- end -}}
{{- end -}}
{{- $enabled := include "vgpud.enabledPresets" . | fromJsonArray -}}
{{- range $p, $names := .Values.config.resourceNames | default dict -}}
{{- if not (hasKey $presets $p) -}}
{{- fail (printf "config.resourceNames: unknown preset %q; choose one of %s" $p $known) -}}
{{- end -}}
{{- if not (has $p $enabled) -}}
{{- fail (printf "config.resourceNames.%s: the preset is not enabled (config.resourcePreset or config.compatPresets): its names would not be read" $p) -}}
{{- end -}}
{{- if not (kindIs "map" $names) -}}
{{- fail (printf "config.resourceNames.%s: expected a map of names (domain, resourceName, resourceMem, resourceCores, resourceMemPercentage, resourcePriority)" $p) -}}
{{- end -}}
{{- range $key, $v := $names -}}
{{- if regexMatch `^([^/]*\.)?kubernetes\.io(/|$)` (toString $v) -}}
{{- fail (printf "config.resourceNames.%s.%s: %q: the kubernetes.io domains are Kubernetes' own" $p $key (toString $v)) -}}
{{- end -}}
{{- if not (has $key (list "domain" "resourceName" "resourceMem" "resourceCores" "resourceMemPercentage" "resourcePriority")) -}}
{{- fail (printf "config.resourceNames.%s.%s: unknown key; the keys are domain, resourceName, resourceMem, resourceCores, resourceMemPercentage, resourcePriority" $p $key) -}}
{{- end -}}
{{- if and (eq $p "tke") (has $key (list "resourceCores" "resourceMemPercentage" "resourcePriority")) -}}
{{- fail (printf "config.resourceNames.tke.%s: TKE's names are vcuda-core (resourceName) and vcuda-memory (resourceMem)" $key) -}}
{{- end -}}
{{- if eq $key "domain" -}}
{{- if not (regexMatch `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$` (toString $v)) -}}
{{- fail (printf "config.resourceNames.%s.domain: %q is not a DNS subdomain (like example.com)" $p (toString $v)) -}}
{{- end -}}
{{- else if not (and (has $key (list "resourceMemPercentage" "resourcePriority")) (eq (toString $v) "")) -}}
{{- if not (regexMatch `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$` (toString $v)) -}}
{{- fail (printf "config.resourceNames.%s.%s: %q is not an extended resource name (<domain>/<name>, like example.com/vgpu)" $p $key (toString $v)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $all := include "vgpud.resourceNames" (dict "ctx" . "fields" (list "number" "memory" "cores" "memoryPercent" "priority")) | fromJsonArray -}}
{{- $named := include "vgpud.namedPresets" . | fromYaml -}}
{{- $count := 0 -}}
{{- range $p := $enabled -}}
{{- $t := get $named $p -}}
{{- range $f := list "number" "memory" "cores" "memoryPercent" "priority" -}}
{{- if get $t $f -}}{{- $count = add1 $count -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if ne (len $all) (int $count) -}}
{{- fail "config.resourceNames: two resources of the enabled presets have one name; each must have its own" -}}
{{- end -}}
{{- $wh := .Values.webhook -}}
{{- if not (has $wh.certs.mode (list "bootstrap" "cert-manager")) -}}
{{- fail (printf "webhook.certs.mode: %q is neither bootstrap nor cert-manager" (toString $wh.certs.mode)) -}}
{{- end -}}
{{- if not (has $wh.failurePolicy (list "Fail" "Ignore")) -}}
{{- fail (printf "webhook.failurePolicy: %q is neither Fail nor Ignore" (toString $wh.failurePolicy)) -}}
{{- end -}}
{{- if or (lt (int $wh.timeoutSeconds) 1) (gt (int $wh.timeoutSeconds) 30) -}}
{{- fail "webhook.timeoutSeconds must be between 1 and 30 (the API server's limit)" -}}
{{- end -}}
{{- if and (gt (int .Values.scheduler.replicas) 1) (not .Values.scheduler.leaderElect) -}}
{{- fail "scheduler.replicas > 1 needs scheduler.leaderElect=true: without it every replica schedules" -}}
{{- end -}}
{{- if and (gt (int .Values.scheduler.replicas) 1) (eq (toString .Values.scheduler.extender.leaderElect) "false") -}}
{{- fail "scheduler.replicas > 1 needs scheduler.extender.leaderElect unset or true: without it every replica runs the reschedule controller" -}}
{{- end -}}
{{- if and .Values.opsAuth.enabled (not .Values.opsAuth.existingSecret) -}}
{{- fail "opsAuth.enabled needs opsAuth.existingSecret: a Secret in the release namespace holding the token under opsAuth.key" -}}
{{- end -}}
{{- if and .Values.opsAuth.enabled .Values.config.ops.tokenFile -}}
{{- fail "config.ops.tokenFile is set by opsAuth: leave it empty when opsAuth.enabled" -}}
{{- end -}}
{{- if eq .Values.config.schedulerName "default-scheduler" -}}
{{- fail "config.schedulerName must not be default-scheduler: vgpud runs as a second scheduler" -}}
{{- end -}}
{{- end -}}
