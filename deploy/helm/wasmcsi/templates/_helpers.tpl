{{/* The values of the chosen layout: nodeLocal or split. */}}
{{- define "wasmcsi.l" -}}
{{- if eq .Values.layout "nodeLocal" -}}
{{- toYaml .Values.nodeLocal -}}
{{- else if eq .Values.layout "split" -}}
{{- toYaml .Values.split -}}
{{- else -}}
{{- fail (printf "layout %q: want nodeLocal or split" .Values.layout) -}}
{{- end -}}
{{- end -}}

{{- define "wasmcsi.name" -}}
{{- (include "wasmcsi.l" . | fromYaml).name -}}
{{- end -}}

{{- define "wasmcsi.driver" -}}
{{- (include "wasmcsi.l" . | fromYaml).driverName -}}
{{- end -}}

{{- define "wasmcsi.labels" -}}
app.kubernetes.io/name: {{ include "wasmcsi.name" . }}
{{- end -}}

{{- define "wasmcsi.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/*
wasmcsi.config renders a daemon configuration. Argument: a dict with
root (the chart's top scope), role, dir (the daemon's folder under
basePath, "" for the node-local layout), metricsHost (the address to bind
metrics to, "" for every address), metricsPort and backends.
*/}}
{{- define "wasmcsi.config" -}}
{{- $v := .root.Values -}}
{{- $l := include "wasmcsi.l" .root | fromYaml -}}
{{- $dir := $l.basePath -}}
{{- if .dir }}{{ $dir = printf "%s/%s" $l.basePath .dir }}{{ end -}}
driver_name: {{ $l.driverName }}
role: {{ .role }}
state_dir: {{ $dir }}/state
module_dir: {{ $dir }}/modules
cache_dir: {{ $dir }}/cache
watch_modules: {{ $v.daemon.watchModules }}
metrics_address: "{{ .metricsHost | default "" }}:{{ .metricsPort }}"
backend_parameter: {{ $v.daemon.backendParameter }}
default_backend: {{ $l.defaultBackend | quote }}
log_level: {{ $v.daemon.logLevel }}
log_format: {{ $v.daemon.logFormat }}
{{- with $l.limits }}
limits:
{{- toYaml . | nindent 2 }}
{{- end }}
reconcile:
  clean: {{ $v.daemon.reconcileClean }}
modules:
{{- range $name, $b := .backends }}
  {{ $name }}:
    sha256: {{ $b.sha256 | default "" | quote }}
    hostcalls: {{ toJson $b.hostcalls }}
    roots:
    {{- if or (not (hasKey $b "pool")) $b.pool }}
      - {{ $l.basePath }}/pools/{{ $name }}
    {{- end }}
    {{- range $b.extraRoots }}
      - {{ . | quote }}
    {{- end }}
    config: {{ toJson ($b.config | default dict) }}
{{- end }}
{{- end -}}

{{/* wasmcsi.install: the install-modules command for a module folder. */}}
{{- define "wasmcsi.install" -}}
- cp
- --preserve=mode,timestamps
- --remove-destination
- --target-directory={{ .dir }}
{{- range $name, $_ := .backends }}
- /opt/wasmcsi/modules/{{ $name }}.wasm
{{- end }}
{{- end -}}

{{/* wasmcsi.nsenv: the NAMESPACE variable of leader-elected sidecars. */}}
{{- define "wasmcsi.nsenv" -}}
- name: NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end -}}
