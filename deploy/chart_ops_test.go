package deploy

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// asMap decodes an object as plain data.
func asMap(t *testing.T, o object) map[string]any {
	t.Helper()
	var m map[string]any
	o.decode(t, &m)
	return m
}

// dig walks nested maps by key.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func podOf(o map[string]any) map[string]any {
	p, _ := dig(o, "spec", "template", "spec").(map[string]any)
	return p
}

func containersOf(pod map[string]any) []map[string]any {
	var out []map[string]any
	for _, c := range append(slices.Clone(asList(pod["initContainers"])), asList(pod["containers"])...) {
		if m, ok := c.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func portNames(c map[string]any) []string {
	var names []string
	for _, p := range asList(c["ports"]) {
		if n, ok := dig(p, "name").(string); ok {
			names = append(names, n)
		}
	}
	return names
}

// Every workload of both layouts runs on Linux nodes, becomes available
// only after its probes held (minReadySeconds), checks its daemon with
// startup, readiness and liveness probes, and every sidecar with a
// liveness probe (where it serves HTTP) and a restricted security context;
// and a daemon that logs in to iSCSI targets can write /etc/iscsi, where
// `iscsiadm -m node -o new` writes node records with bookworm's open-iscsi.
// The chart renders the same objects (TestHelmChartRendersTheManifests).
func TestWorkloadsProbesAndSecurity(t *testing.T) {
	for _, l := range layouts {
		for _, o := range readObjects(t, l.dir) {
			if o.Kind != "DaemonSet" && o.Kind != "Deployment" {
				continue
			}
			m := asMap(t, o)
			who := l.dir + "/" + o.Metadata.Name
			if n, _ := dig(m, "spec", "minReadySeconds").(int); n <= 0 {
				t.Errorf("%s: no minReadySeconds", who)
			}
			pod := podOf(m)
			if os, _ := dig(pod, "nodeSelector", "kubernetes.io/os").(string); os != "linux" {
				t.Errorf("%s: nodeSelector lacks kubernetes.io/os: linux", who)
			}
			var podPorts []string
			for _, c := range containersOf(pod) {
				podPorts = append(podPorts, portNames(c)...)
			}
			for _, c := range containersOf(pod) {
				name, _ := c["name"].(string)
				cw := who + "/" + name
				if name == "wasmcsi" {
					for _, p := range []string{"startupProbe", "readinessProbe", "livenessProbe"} {
						port, _ := dig(c, p, "httpGet", "port").(string)
						if !slices.Contains(podPorts, port) {
							t.Errorf("%s: %s on port %q, which no container of the pod serves", cw, p, port)
						}
					}
					for _, vm := range asList(c["volumeMounts"]) {
						if dig(vm, "mountPath") == "/etc/iscsi" && dig(vm, "readOnly") == true {
							t.Errorf("%s: /etc/iscsi is read-only; iscsiadm -m node -o new writes node records there", cw)
						}
					}
					continue
				}
				if name == "install-modules" {
					continue
				}
				if dig(c, "securityContext", "allowPrivilegeEscalation") != false || dig(c, "securityContext", "readOnlyRootFilesystem") != true {
					t.Errorf("%s: sidecar securityContext %v", cw, c["securityContext"])
				}
				if name == "livenessprobe" {
					continue // it is the daemon's probe
				}
				port, _ := dig(c, "livenessProbe", "httpGet", "port").(string)
				if port == "" || !slices.Contains(portNames(c), port) {
					t.Errorf("%s: no liveness probe on a port of its own (%q, ports %v)", cw, port, portNames(c))
				}
				path, _ := dig(c, "livenessProbe", "httpGet", "path").(string)
				leader := false
				for _, a := range asList(c["args"]) {
					leader = leader || a == "--leader-election"
				}
				// Sidecars serve /healthz/leader-election only when they
				// elect a leader.
				if path == "/healthz/leader-election" && !leader {
					t.Errorf("%s: probes %s without --leader-election", cw, path)
				}
			}
		}
	}
}

// daemonMetrics are the metric names the daemon's sources register.
func daemonMetrics(t *testing.T) []string {
	t.Helper()
	vec := regexp.MustCompile(`Namespace: "wasmcsi",\s*(?:Subsystem: "(\w+)",\s*)?Name: "(\w+)"`)
	desc := regexp.MustCompile(`prometheus\.NewDesc\("(wasmcsi_\w+)"`)
	var names []string
	for _, f := range []string{"../host/metrics.go", "../modules/metrics.go"} {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range vec.FindAllStringSubmatch(string(src), -1) {
			n := "wasmcsi_"
			if m[1] != "" {
				n += m[1] + "_"
			}
			names = append(names, n+m[2])
		}
		for _, m := range desc.FindAllStringSubmatch(string(src), -1) {
			names = append(names, m[1])
		}
	}
	if len(names) < 5 {
		t.Fatalf("found only %v in the metrics sources", names)
	}
	return names
}

// Every metric the daemon exports has a row in the guide's metrics table.
func TestMetricsDocumented(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range daemonMetrics(t) {
		if !strings.Contains(string(readme), "| `"+n+"` |") {
			t.Errorf("metric %s is not in deploy/README.md's metrics table", n)
		}
	}
}

// render renders the chart as release rel in namespace ns, returning the
// objects or the error.
func render(t *testing.T, helm, rel, ns string, flags ...string) ([]object, error) {
	t.Helper()
	out, err := renderReleaseErr(helm, rel, ns, flags...)
	if err != nil {
		return nil, err
	}
	file := t.TempDir() + "/rendered.yaml"
	if err := os.WriteFile(file, out, 0o600); err != nil {
		t.Fatal(err)
	}
	var objs []object
	for _, n := range readDocs(t, file) {
		o := object{file: file, node: n}
		o.decode(t, &o)
		if o.Kind != "" {
			objs = append(objs, o)
		}
	}
	return objs, nil
}

func mustRender(t *testing.T, helm, rel, ns string, flags ...string) []object {
	t.Helper()
	objs, err := render(t, helm, rel, ns, flags...)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func kinds(objs []object, kind string) []string {
	var names []string
	for _, o := range objs {
		if o.Kind == kind {
			names = append(names, o.Metadata.Name)
		}
	}
	return names
}

// What an operator reviewing the chart asked for, value by value.
func TestHelmChartOperatorValues(t *testing.T) {
	helm := helmBinary(t)
	kube := []string{"--kube-version", "1.34.0"}
	with := func(flags ...string) []string { return append(slices.Clone(kube), flags...) }
	portal := []string{"--set", "layout=split",
		"--set", "split.controller.backends.iscsi.config.portal=10.1.2.3:3260",
		"--set", "split.controller.backends.iscsi.extraRoots={iqn.2026-01.dev.wasmcsi:,10.1.2.3:3260,0.0.0.0:3260}",
		"--set", "split.node.backends.iscsi.extraRoots={10.1.2.3:3260}",
		"--set", "split.controller.backends.nvmeof.config.address=10.1.2.3:4420",
		"--set", "split.controller.backends.nvmeof.extraRoots={nqn.2026-01.dev.wasmcsi:,10.1.2.3:4420,0.0.0.0:4420}",
		"--set", "split.node.backends.nvmeof.extraRoots={10.1.2.3:4420}"}

	t.Run("placeholder portal", func(t *testing.T) {
		if _, err := render(t, helm, "wasmcsi", "s", with("--set", "layout=split")...); err == nil || !strings.Contains(err.Error(), "192.0.2.5") {
			t.Errorf("split layout with the placeholder portal: %v", err)
		}
		// Replaced in one list only: still refused.
		if _, err := render(t, helm, "wasmcsi", "s", with("--set", "layout=split", "--set", "split.controller.backends.iscsi.config.portal=10.1.2.3:3260")...); err == nil {
			t.Error("placeholder left in the roots, rendered anyway")
		}
		// The iSCSI portal replaced, the NVMe/TCP address not: refused.
		if _, err := render(t, helm, "wasmcsi", "s", with(portal[:8]...)...); err == nil || !strings.Contains(err.Error(), "192.0.2.5") {
			t.Errorf("split layout with the placeholder NVMe/TCP address: %v", err)
		}
		mustRender(t, helm, "wasmcsi", "s", with(portal...)...)
	})

	t.Run("unknown keys", func(t *testing.T) {
		for _, set := range []string{"imagee.tag=x", "nodeLocal.storageclasses[0].name=x", "sidecars.provisioner.extra_args={a}", "daemon.logLevel=verbose"} {
			if _, err := render(t, helm, "wasmcsi", "w", with("--set", set)...); err == nil {
				t.Errorf("--set %s rendered; the schema should refuse it", set)
			}
		}
	})

	t.Run("CHAP from a Secret", func(t *testing.T) {
		objs := mustRender(t, helm, "wasmcsi", "s", with(append(portal, "--set", "split.chapSecret=iscsi-chap")...)...)
		l := layouts[1]
		l.namespace = "s"
		for _, w := range []struct{ workload, key string }{{"wasmcsi-iscsi-controller", "controller.yaml"}, {"wasmcsi-iscsi-node", "node.yaml"}} {
			spec, ok := workloads(t, objs)[w.workload]
			if !ok {
				t.Fatalf("no %s", w.workload)
			}
			d := spec.container(t, "wasmcsi")
			for _, e := range d.Env {
				if strings.Contains(e.Name, "CHAP") && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "iscsi-chap") {
					t.Errorf("%s: %s not from the Secret", w.workload, e.Name)
				}
			}
			cfgText := configMapYAML(t, l, objs, w.key)
			if strings.Contains(cfgText, "chap") {
				t.Errorf("%s: the ConfigMap names CHAP:\n%s", w.key, cfgText)
			}
			cfg := loadConfig(t, cfgText, podEnviron(t, d))
			if c := cfg.Modules["iscsi"].Config; c["chap_user"] != "secret-chap_user" || c["chap_secret"] != "secret-chap_secret" {
				t.Errorf("%s: iscsi config %v lacks the Secret's credentials", w.workload, c)
			}
		}
	})

	t.Run("names, labels, images", func(t *testing.T) {
		objs := mustRender(t, helm, "storage", "st", with("--set", "imagePullSecrets[0].name=reg",
			"--set", "image.digest=sha256:"+strings.Repeat("a", 64),
			"--set", "sidecars.resizer.digest=sha256:"+strings.Repeat("b", 64))...)
		if got := kinds(objs, "DaemonSet"); !slices.Equal(got, []string{"storage-wasmcsi"}) {
			t.Errorf("DaemonSets %v, want the release's name", got)
		}
		if _, ok := find(objs, "ConfigMap", "storage-wasmcsi-config"); !ok {
			t.Error("no ConfigMap storage-wasmcsi-config")
		}
		for _, o := range objs {
			l := dig(asMap(t, o), "metadata", "labels")
			if dig(l, "app.kubernetes.io/instance") != "storage" || dig(l, "app.kubernetes.io/managed-by") != "Helm" || dig(l, "helm.sh/chart") == nil {
				t.Errorf("%s %s: labels %v", o.Kind, o.Metadata.Name, l)
			}
		}
		ds := mustFind(t, objs, "DaemonSet", "storage-wasmcsi")
		m := asMap(t, ds)
		if sel := dig(m, "spec", "selector", "matchLabels", "app.kubernetes.io/instance"); sel != "storage" {
			t.Errorf("selector instance %v", sel)
		}
		pod := podOf(m)
		if ps := asList(pod["imagePullSecrets"]); len(ps) != 1 || dig(ps[0], "name") != "reg" {
			t.Errorf("imagePullSecrets %v", pod["imagePullSecrets"])
		}
		for _, c := range containersOf(pod) {
			im, _ := c["image"].(string)
			switch c["name"] {
			case "wasmcsi", "install-modules":
				if im != "wasmcsi/wasmcsi@sha256:"+strings.Repeat("a", 64) {
					t.Errorf("%s image %s", c["name"], im)
				}
			case "csi-resizer":
				if im != "registry.k8s.io/sig-storage/csi-resizer@sha256:"+strings.Repeat("b", 64) {
					t.Errorf("resizer image %s", im)
				}
			}
		}
		// The tag defaults to appVersion.
		chart, err := os.ReadFile(chartDir + "/Chart.yaml")
		if err != nil {
			t.Fatal(err)
		}
		app := regexp.MustCompile(`(?m)^appVersion: (\S+)`).FindSubmatch(chart)
		objs = mustRender(t, helm, "wasmcsi", "w", kube...)
		if im := workloads(t, objs)["wasmcsi"].container(t, "wasmcsi").Image; app == nil || im != "wasmcsi/wasmcsi:"+string(app[1]) {
			t.Errorf("image %s, want the appVersion tag", im)
		}
	})

	t.Run("config checksum", func(t *testing.T) {
		sum := func(flags ...string) string {
			objs := mustRender(t, helm, "wasmcsi", "w", with(flags...)...)
			v, _ := dig(asMap(t, mustFind(t, objs, "DaemonSet", "wasmcsi")), "spec", "template", "metadata", "annotations", "checksum/config").(string)
			if v == "" {
				t.Fatal("no checksum/config annotation")
			}
			return v
		}
		a, b, c := sum(), sum("--set", "sidecars.resizer.extraArgs={--v=5}"), sum("--set", "daemon.logLevel=debug")
		if a != b {
			t.Error("checksum changed without a configuration change")
		}
		if a == c {
			t.Error("checksum unchanged after daemon.logLevel changed")
		}
	})

	t.Run("switches", func(t *testing.T) {
		// Snapshot classes only where the CRDs are served, unless forced.
		if got := kinds(mustRender(t, helm, "wasmcsi", "w", kube...), "VolumeSnapshotClass"); len(got) != 0 {
			t.Errorf("VolumeSnapshotClass %v rendered for a cluster without the CRDs", got)
		}
		if got := kinds(mustRender(t, helm, "wasmcsi", "w", with("--set", "nodeLocal.snapshotClass=true")...), "VolumeSnapshotClass"); len(got) != 1 {
			t.Errorf("snapshotClass=true: %v", got)
		}
		if got := kinds(mustRender(t, helm, "wasmcsi", "w", chartCluster...), "VolumeSnapshotClass"); len(got) != 1 {
			t.Errorf("CRDs served: %v", got)
		}
		// One value removes a backend: grant, module copy, classes.
		objs := mustRender(t, helm, "wasmcsi", "w", with("--set", "nodeLocal.backends.dmthin=null")...)
		for _, sc := range kinds(objs, "StorageClass") {
			if strings.Contains(sc, "dmthin") {
				t.Errorf("StorageClass %s of a removed backend", sc)
			}
		}
		// No init container when the module folder is the operator's.
		objs = mustRender(t, helm, "wasmcsi", "w", with("--set", "installModules.enabled=false")...)
		if ic := workloads(t, objs)["wasmcsi"].InitContainers; len(ic) != 0 {
			t.Errorf("init containers %v with installModules.enabled=false", ic)
		}
		// Inline ephemeral volumes can be turned off.
		objs = mustRender(t, helm, "wasmcsi", "w", with("--set", "nodeLocal.inlineEphemeral=false")...)
		if modes := dig(asMap(t, mustFind(t, objs, "CSIDriver", "wasmcsi.dev")), "spec", "volumeLifecycleModes"); slices.Contains(asList(modes), any("Ephemeral")) {
			t.Errorf("volumeLifecycleModes %v with inlineEphemeral=false", modes)
		}
		// Only the RBAC of sidecars that run.
		objs = mustRender(t, helm, "wasmcsi", "w", kube...)
		for _, n := range append(kinds(objs, "ClusterRole"), kinds(objs, "ClusterRoleBinding")...) {
			if strings.Contains(n, "attacher") || strings.Contains(n, "snapshot-metadata") {
				t.Errorf("%s rendered in the node-local layout, where it does not run", n)
			}
		}
	})

	t.Run("monitoring", func(t *testing.T) {
		objs := mustRender(t, helm, "wasmcsi", "w", with("--set", "monitoring.podMonitor.enabled=true", "--set", "monitoring.prometheusRule.enabled=true")...)
		mustFind(t, objs, "PodMonitor", "wasmcsi")
		rule := asMap(t, mustFind(t, objs, "PrometheusRule", "wasmcsi"))
		exported := daemonMetrics(t)
		var alerts []string
		for _, g := range asList(dig(rule, "spec", "groups")) {
			for _, r := range asList(dig(g, "rules")) {
				alerts = append(alerts, dig(r, "alert").(string))
				expr, _ := dig(r, "expr").(string)
				for _, m := range regexp.MustCompile(`wasmcsi_\w+`).FindAllString(expr, -1) {
					if !slices.Contains(exported, m) {
						t.Errorf("alert %s uses %s, which the daemon does not export", dig(r, "alert"), m)
					}
				}
			}
		}
		for _, want := range []string{"WasmcsiPoolNearlyFull", "WasmcsiModuleRefused", "WasmcsiCSICallsFailing", "WasmcsiVolumeConditionAbnormal"} {
			if !slices.Contains(alerts, want) {
				t.Errorf("no alert %s in %v", want, alerts)
			}
		}
		if got := kinds(mustRender(t, helm, "wasmcsi", "w", kube...), "PrometheusRule"); len(got) != 0 {
			t.Errorf("PrometheusRule rendered by default: %v", got)
		}
	})
}
