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
	if len(names) < 10 {
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
