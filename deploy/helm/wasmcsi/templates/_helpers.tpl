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

{{/*
wasmcsi.name: the prefix of every object name and app.kubernetes.io/name.
The layout's name when set, else derived from the release: the release
name when it contains "wasmcsi" (else "<release>-wasmcsi"), with "-iscsi"
appended in the split layout unless it already ends so.
*/}}
{{- define "wasmcsi.name" -}}
{{- $l := include "wasmcsi.l" . | fromYaml -}}
{{- if $l.name -}}
{{- $l.name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $n := .Release.Name -}}
{{- if not (contains "wasmcsi" $n) }}{{ $n = printf "%s-wasmcsi" $n }}{{ end -}}
{{- if and (eq .Values.layout "split") (not (hasSuffix "iscsi" $n)) }}{{ $n = printf "%s-iscsi" $n }}{{ end -}}
{{- $n | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "wasmcsi.driver" -}}
{{- (include "wasmcsi.l" . | fromYaml).driverName -}}
{{- end -}}

{{/* wasmcsi.selectorLabels: what workloads and Services select on. */}}
{{- define "wasmcsi.selectorLabels" -}}
app.kubernetes.io/name: {{ include "wasmcsi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* wasmcsi.labels: the standard labels of every object. */}}
{{- define "wasmcsi.labels" -}}
{{ include "wasmcsi.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* wasmcsi.image: the wasmcsi image; the tag defaults to appVersion, a digest wins. */}}
{{- define "wasmcsi.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* wasmcsi.sidecarImage: a sidecar's image, by digest when one is given. */}}
{{- define "wasmcsi.sidecarImage" -}}
{{- if .digest -}}
{{ (splitList ":" .image | initial | join ":") }}@{{ .digest }}
{{- else -}}
{{ .image }}
{{- end -}}
{{- end -}}

{{/*
wasmcsi.podCommon: imagePullSecrets, nodeSelector (kubernetes.io/os: linux
and the workload's own), affinity and tolerations of a pod. Argument: a dict
with root and w (the workload's values).
*/}}
{{- define "wasmcsi.podCommon" -}}
{{- with .root.Values.imagePullSecrets -}}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
nodeSelector:
  kubernetes.io/os: linux
  {{- with .w.nodeSelector }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .w.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .w.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
wasmcsi.checkPortal fails on the documentation address 192.0.2.5 (RFC 5737)
left in the split layout's values: nodes would log in to nowhere.
*/}}
{{- define "wasmcsi.checkPortal" -}}
{{- if and (eq .Values.layout "split") (not .Values.split.allowPlaceholderPortal) -}}
{{- if contains "192.0.2.5" (toYaml .Values.split) -}}
{{- fail "split layout: the iSCSI portal or the NVMe/TCP address is still the placeholder 192.0.2.5; set split.controller.backends.iscsi.config.portal, split.controller.backends.iscsi.extraRoots and split.node.backends.iscsi.extraRoots (and split.controller.backends.nvmeof.config.address, split.controller.backends.nvmeof.extraRoots and split.node.backends.nvmeof.extraRoots, or remove the nvmeof backends) to the storage host's address (deploy/README.md, \"iSCSI\")" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* wasmcsi.chapEnv: CHAP credentials of the iscsi module from a Secret. */}}
{{- define "wasmcsi.chapEnv" -}}
{{- with .Values.split.chapSecret }}
- name: WASMCSI_MODULES__ISCSI__CONFIG__CHAP_USER
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: chap_user
- name: WASMCSI_MODULES__ISCSI__CONFIG__CHAP_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: chap_secret
{{- end }}
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
{{- if include "wasmcsi.ociUsed" .backends }}
oci:
  key: /etc/wasmcsi-oci/key/{{ $v.oci.publicKey.key }}
  interval: {{ $v.oci.interval }}
  plain_http: {{ toJson ($v.oci.plainHTTP | default list) }}
  auth_file: {{ if $v.oci.authSecret }}/etc/wasmcsi-oci/auth/config.json{{ else }}""{{ end }}
{{- end }}
modules:
{{- range $name, $b := .backends }}
  {{ $name }}:
    {{- with $b.source }}
    source: {{ . | quote }}
    {{- end }}
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

{{/*
wasmcsi.install: the install-modules command for a module folder: the
backends without a source (those come from a registry).
*/}}
{{- define "wasmcsi.install" -}}
{{- $files := list -}}
{{- range $name, $b := .backends }}{{ if not ($b | default dict).source }}{{ $files = append $files $name }}{{ end }}{{ end -}}
{{- if $files -}}
- cp
- --preserve=mode,timestamps
- --remove-destination
- --target-directory={{ .dir }}
{{- range $files }}
- /opt/wasmcsi/modules/{{ . }}.wasm
{{- end }}
{{- else -}}
- "true"
{{- end }}
{{- end -}}

{{/* wasmcsi.ociUsed: non-empty when a backend comes from a registry. */}}
{{- define "wasmcsi.ociUsed" -}}
{{- range $_, $b := . }}{{ if ($b | default dict).source }}yes{{ end }}{{ end -}}
{{- end -}}

{{/*
wasmcsi.ociMounts and wasmcsi.ociVolumes: the public key (and registry
credentials) of the backends from a registry, in the daemon's container.
Argument: a dict with root and backends.
*/}}
{{- define "wasmcsi.ociMounts" -}}
{{- if include "wasmcsi.ociUsed" .backends }}
- name: oci-key
  mountPath: /etc/wasmcsi-oci/key
  readOnly: true
{{- if .root.Values.oci.authSecret }}
- name: oci-auth
  mountPath: /etc/wasmcsi-oci/auth
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{- define "wasmcsi.ociVolumes" -}}
{{- if include "wasmcsi.ociUsed" .backends }}
{{- $k := .root.Values.oci.publicKey }}
- name: oci-key
{{- if $k.secret }}
  secret:
    secretName: {{ $k.secret }}
{{- else if $k.configMap }}
  configMap:
    name: {{ $k.configMap }}
{{- else }}
{{- fail "a backend has an oci:// source: set oci.publicKey.secret or oci.publicKey.configMap to the public key that signs it" }}
{{- end }}
{{- with .root.Values.oci.authSecret }}
- name: oci-auth
  secret:
    secretName: {{ . }}
    items:
      - key: .dockerconfigjson
        path: config.json
{{- end }}
{{- end }}
{{- end -}}

{{/* wasmcsi.nsenv: the NAMESPACE variable of leader-elected sidecars. */}}
{{- define "wasmcsi.nsenv" -}}
- name: NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end -}}
