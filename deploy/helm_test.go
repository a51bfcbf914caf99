package deploy

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const chartDir = "helm/wasmcsi"

// helmBinary returns the helm to render the chart with: WASMCSI_HELM
// (.ci/helm.sh prints one), else helm on PATH; the test skips without.
func helmBinary(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("WASMCSI_HELM"); h != "" {
		return h
	}
	h, err := exec.LookPath("helm")
	if err != nil {
		t.Skip("needs helm: set WASMCSI_HELM=$(.ci/helm.sh) or put helm on PATH: ", err)
	}
	return h
}

// renderChart runs helm template on the chart in namespace ns with the
// given helm flags and returns the objects it renders.
func renderChart(t *testing.T, helm, ns string, flags ...string) []object {
	t.Helper()
	out, err := renderChartErr(helm, ns, flags...)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "rendered.yaml")
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
	return objs
}

// chartCluster is what helm template assumes of the cluster: the chart's
// kubeVersion floor is newer than helm's offline default, and the snapshot
// CRDs are served (the chart renders its snapshot classes only then).
var chartCluster = []string{
	"--kube-version", "1.34.0",
	"--api-versions", "snapshot.storage.k8s.io/v1/VolumeSnapshotClass",
	"--api-versions", "groupsnapshot.storage.k8s.io/v1beta2/VolumeGroupSnapshotClass",
}

func renderChartErr(helm, ns string, flags ...string) ([]byte, error) {
	return renderReleaseErr(helm, "wasmcsi", ns, append(slices.Clone(chartCluster), flags...)...)
}

// renderReleaseErr runs helm template for release name rel with exactly
// the given flags.
func renderReleaseErr(helm, rel, ns string, flags ...string) ([]byte, error) {
	args := append([]string{"template", rel, chartDir, "--namespace", ns}, flags...)
	out, err := exec.Command(helm, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		return nil, fmt.Errorf("helm %s: %v", strings.Join(args, " "), err)
	}
	return out, nil
}

// chartOnly are the labels and annotations only Helm's objects carry: the
// release's standard labels and the configuration checksum.
var chartOnly = []string{"app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/version", "helm.sh/chart", "checksum/config"}

// dropChartOnly removes the chartOnly keys from every labels, matchLabels,
// selector and annotations map in v.
func dropChartOnly(v any) {
	switch x := v.(type) {
	case map[string]any:
		for k, c := range x {
			if m, ok := c.(map[string]any); ok && (k == "labels" || k == "matchLabels" || k == "selector" || k == "annotations") {
				for _, l := range chartOnly {
					delete(m, l)
				}
			}
			dropChartOnly(c)
		}
	case []any:
		for _, c := range x {
			dropChartOnly(c)
		}
	}
}

// normalized is an object as plain data, with a ConfigMap's values parsed
// as YAML (they are daemon configurations, whose comments and key order
// mean nothing) and without the chart-only labels and annotations.
func normalized(t *testing.T, o object) any {
	t.Helper()
	var m map[string]any
	o.decode(t, &m)
	dropChartOnly(m)
	if o.Kind == "ConfigMap" {
		data, _ := m["data"].(map[string]any)
		for k, v := range data {
			var parsed any
			if err := yaml.Unmarshal([]byte(fmt.Sprint(v)), &parsed); err != nil {
				t.Fatalf("ConfigMap %s: %s: %v", o.Metadata.Name, k, err)
			}
			data[k] = parsed
		}
	}
	return m
}

func objectKey(o object) string { return o.Kind + "/" + o.Metadata.Namespace + "/" + o.Metadata.Name }

// sameObjects checks that two sets of objects are equal object by object.
func sameObjects(t *testing.T, got, want []object) {
	t.Helper()
	index := func(objs []object) map[string]object {
		m := map[string]object{}
		for _, o := range objs {
			if _, dup := m[objectKey(o)]; dup {
				t.Errorf("%s twice", objectKey(o))
			}
			m[objectKey(o)] = o
		}
		return m
	}
	g, w := index(got), index(want)
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range w {
			if !yield(k) {
				return
			}
		}
	}) {
		wo := w[k]
		gobj, ok := g[k]
		if !ok {
			t.Errorf("the chart renders no %s (from %s)", k, wo.file)
			continue
		}
		gn, wn := normalized(t, gobj), normalized(t, wo)
		if !reflect.DeepEqual(gn, wn) {
			gy, _ := yaml.Marshal(gn)
			wy, _ := yaml.Marshal(wn)
			t.Errorf("%s differs from %s:\n--- chart\n%s\n--- %s\n%s", k, wo.file, gy, wo.file, wy)
		}
	}
	for k := range g {
		if _, ok := w[k]; !ok {
			t.Errorf("the chart renders %s, which the manifests lack", k)
		}
	}
}

// The chart's defaults render the objects of kubernetes/ and, with
// layout=split, those of kubernetes-split/, object by object; so every
// check of the manifests holds for the chart too.
func TestHelmChartRendersTheManifests(t *testing.T) {
	helm := helmBinary(t)
	for _, tc := range []struct {
		l     layout
		flags []string
	}{
		{layouts[0], []string{"--set", "createNamespace=true"}},
		{layouts[1], []string{"--set", "createNamespace=true", "--set", "layout=split", "--set", "split.allowPlaceholderPortal=true"}},
	} {
		t.Run(tc.l.dir, func(t *testing.T) {
			sameObjects(t, renderChart(t, helm, tc.l.namespace, tc.flags...), readObjects(t, tc.l.dir))
		})
	}
	for _, set := range []string{"layout=nodeLocal", "layout=split"} {
		args := []string{"lint", "--strict", chartDir, "--set", set, "--kube-version", "1.34.0"}
		if out, err := exec.Command(helm, args...).CombinedOutput(); err != nil {
			t.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// By default the chart leaves the namespace to the operator.
	t.Run("no namespace", func(t *testing.T) {
		var want []object
		for _, o := range readObjects(t, "kubernetes") {
			if o.Kind != "Namespace" {
				want = append(want, o)
			}
		}
		sameObjects(t, renderChart(t, helm, "wasmcsi"), want)
	})
}

// Values change what they say: sidecars turn off, take extra flags and
// other images; backends and paths move; the optional snapshot-metadata
// sidecar needs its CA.
func TestHelmChartValues(t *testing.T) {
	helm := helmBinary(t)
	containers := func(objs []object, workload string) map[string]container {
		spec, ok := workloads(t, objs)[workload]
		if !ok {
			t.Fatalf("no workload %s", workload)
		}
		m := map[string]container{}
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			m[c.Name] = c
		}
		return m
	}

	objs := renderChart(t, helm, "storage",
		"--set", "sidecars.healthMonitor.enabled=false",
		"--set", "sidecars.provisioner.extraArgs={--kube-api-qps=50}",
		"--set", "sidecars.resizer.image=example.org/resizer:v9",
		"--set", "nodeLocal.basePath=/srv/wasmcsi",
		"--set", "nodeLocal.driverName=local.example.org",
		"--set", "kubeletDir=/var/lib/k0s/kubelet",
		"--set", "nodeLocal.backends.dmthin=null")
	cs := containers(objs, "wasmcsi")
	if _, ok := cs["csi-external-health-monitor-controller"]; ok {
		t.Error("health monitor still runs with sidecars.healthMonitor.enabled=false")
	}
	if _, ok := find(objs, "ClusterRole", "wasmcsi-external-health-monitor"); ok {
		t.Error("health monitor RBAC rendered without the health monitor")
	}
	if a := cs["csi-provisioner"].Args; a[len(a)-1] != "--kube-api-qps=50" {
		t.Errorf("provisioner args %q lack the extra flag", a)
	}
	if im := cs["csi-resizer"].Image; im != "example.org/resizer:v9" {
		t.Errorf("resizer image %s", im)
	}
	if got, _ := flag(cs["node-driver-registrar"].Args, "kubelet-registration-path"); got != "/var/lib/k0s/kubelet/plugins/local.example.org/csi.sock" {
		t.Errorf("registration path %s", got)
	}
	l := layout{dir: "rendered", namespace: "storage", base: "/srv/wasmcsi", configMap: "wasmcsi-config"}
	cfg := loadConfig(t, configMapYAML(t, l, objs, "config.yaml"), podEnviron(t, cs["wasmcsi"]))
	if cfg.DriverName != "local.example.org" || cfg.StateDir != "/srv/wasmcsi/state" {
		t.Errorf("driver %s, state_dir %s", cfg.DriverName, cfg.StateDir)
	}
	spec := workloads(t, objs)["wasmcsi"]
	checkInstalls(t, cs["install-modules"].Command, cfg)
	checkRoots(t, spec, cs["wasmcsi"], "/srv/wasmcsi", cfg.Role, "localdir", cfg.Modules["localdir"].Roots)
	if _, ok := cfg.Modules["dmthin"]; ok {
		t.Error("dmthin still granted after nodeLocal.backends.dmthin=null")
	}

	// Changed block tracking is off by default and needs its CA when on.
	if _, err := renderChartErr(helm, "wasmcsi", "--set", "sidecars.snapshotMetadata.enabled=true"); err == nil || !strings.Contains(err.Error(), "caCert") {
		t.Errorf("snapshot metadata without caCert: %v", err)
	}
	objs = renderChart(t, helm, "wasmcsi", "--set", "sidecars.snapshotMetadata.enabled=true", "--set", "sidecars.snapshotMetadata.caCert=Q0E=")
	if _, ok := containers(objs, "wasmcsi")["csi-snapshot-metadata"]; !ok {
		t.Error("no csi-snapshot-metadata sidecar")
	}
	var sms struct {
		Spec struct {
			Address string `yaml:"address"`
		} `yaml:"spec"`
	}
	mustFind(t, objs, "SnapshotMetadataService", "wasmcsi.dev").decode(t, &sms)
	if svc := mustFind(t, objs, "Service", "wasmcsi-snapshot-metadata"); sms.Spec.Address != svc.Metadata.Name+".wasmcsi:6443" {
		t.Errorf("SnapshotMetadataService address %s", sms.Spec.Address)
	}

	// The split layout's sidecars follow the same values.
	objs = renderChart(t, helm, "wasmcsi-iscsi", "--set", "layout=split", "--set", "split.allowPlaceholderPortal=true", "--set", "sidecars.attacher.extraArgs={--worker-threads=20}")
	if a := containers(objs, "wasmcsi-iscsi-controller")["csi-attacher"].Args; a[len(a)-1] != "--worker-threads=20" {
		t.Errorf("attacher args %q", a)
	}
	// The schema refuses the value before the template would.
	if _, err := renderChartErr(helm, "x", "--set", "layout=other"); err == nil || !strings.Contains(err.Error(), "/layout") {
		t.Errorf("layout=other: %v", err)
	}
}

// TestHelmChartLvm: the lvm backend is not granted by default (nothing of
// it renders); granted, its grant reaches the daemon's configuration
// without a pool folder, the daemon shares the host's LVM lock and
// configuration folders, and its StorageClasses name their device class.
func TestHelmChartLvm(t *testing.T) {
	helm := helmBinary(t)
	for _, granted := range []bool{false, true} {
		var flags []string
		if granted {
			flags = []string{"--set-json", `nodeLocal.backends.lvm={"hostcalls":["lvm"],"pool":false,"extraRoots":["lvm:vg0","lvm:vg0:thin0"],` +
				`"config":{"class.thick":"vg0","class.thin":"vg0/thin0","default_class":"thin"}}`}
		}
		objs := renderChart(t, helm, "storage", flags...)
		spec := workloads(t, objs)["wasmcsi"]
		daemon := spec.container(t, "wasmcsi")
		_, lock := daemon.mountAt("/run/lock/lvm")
		_, etc := daemon.mountAt("/etc/lvm")
		v, hostLock := spec.volume("lvm-lock")
		_, thin := find(objs, "StorageClass", "wasmcsi-lvm-thin")
		_, thick := find(objs, "StorageClass", "wasmcsi-lvm-thick")
		if lock != granted || etc != granted || hostLock != granted || thin != granted || thick != granted {
			t.Errorf("lvm granted %v: lock mount %v, /etc/lvm mount %v, host lock folder %v, classes %v %v", granted, lock, etc, hostLock, thin, thick)
		}
		if granted && (v.HostPath == nil || v.HostPath.Path != "/run/lock/lvm") {
			t.Errorf("lock volume %+v", v)
		}
		if !granted {
			continue
		}
		l := layout{dir: "rendered", namespace: "storage", base: "/var/lib/wasmcsi", configMap: "wasmcsi-config"}
		cfg := loadConfig(t, configMapYAML(t, l, objs, "config.yaml"), podEnviron(t, daemon))
		m, ok := cfg.Modules["lvm"]
		if !ok || strings.Join(m.Roots, " ") != "lvm:vg0 lvm:vg0:thin0" || m.Config["class.thin"] != "vg0/thin0" {
			t.Errorf("lvm grant in the daemon's configuration: %+v", m)
		}
		var sc struct {
			Parameters map[string]string `yaml:"parameters"`
		}
		o, _ := find(objs, "StorageClass", "wasmcsi-lvm-thin")
		o.decode(t, &sc)
		if sc.Parameters["deviceClass"] != "thin" || sc.Parameters["wasmcsi.dev/backend"] != "lvm" {
			t.Errorf("wasmcsi-lvm-thin parameters %v", sc.Parameters)
		}
		checkInstalls(t, spec.container(t, "install-modules").Command, cfg)
	}
}
