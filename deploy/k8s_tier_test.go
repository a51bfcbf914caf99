package deploy

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// k8sTier is what the Kubernetes tier (.ci/k8s/test.sh) declares about the
// sidecars it runs: the binary of each DaemonSet container, the flags it
// changes for a host process, and the environment it gives them. The tier
// reads every other argument from daemonset.yaml at run time.
type k8sTier struct {
	script    string
	binaries  map[string]string // container -> binary
	overrides map[string][]string
	env       map[string]string
}

// table returns the lines of the shell string assigned right after marker.
func table(t *testing.T, script, marker, variable string) [][]string {
	t.Helper()
	_, rest, ok := strings.Cut(script, "# "+marker+"\n")
	if !ok {
		t.Fatalf("test.sh: no %s marker", marker)
	}
	_, rest, ok = strings.Cut(rest, variable+"=\"")
	if !ok {
		t.Fatalf("test.sh: no %s after %s", variable, marker)
	}
	body, _, ok := strings.Cut(rest, "\"")
	if !ok {
		t.Fatalf("test.sh: %s unterminated", variable)
	}
	var out [][]string
	for _, l := range strings.Split(body, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			out = append(out, f)
		}
	}
	return out
}

func readK8sTier(t *testing.T) k8sTier {
	t.Helper()
	b, err := os.ReadFile("../.ci/k8s/test.sh")
	if err != nil {
		t.Fatal(err)
	}
	tier := k8sTier{script: string(b), binaries: map[string]string{}, overrides: map[string][]string{}, env: map[string]string{}}
	for _, f := range table(t, tier.script, "K8S_TIER_SIDECARS", "sidecar_table") {
		if len(f) != 3 {
			t.Fatalf("sidecar_table line %q: want container binary api", f)
		}
		tier.binaries[f[0]] = f[1]
	}
	for _, f := range table(t, tier.script, "K8S_TIER_OVERRIDES", "override_table") {
		if len(f) != 3 {
			t.Fatalf("override_table line %q: want container flag value", f)
		}
		tier.overrides[f[0]] = append(tier.overrides[f[0]], f[1]+"="+f[2])
	}
	for _, f := range table(t, tier.script, "K8S_TIER_ENV", "sidecar_env") {
		for _, kv := range f {
			k, v, _ := strings.Cut(kv, "=")
			tier.env[k] = v
		}
	}
	return tier
}

// TestK8sTierSidecars checks that the Kubernetes tier runs the sidecars as
// deploy/kubernetes/daemonset.yaml does: every sidecar container and no
// other, every flag it changes one the container has, every downward-API
// variable set (POD_NAME only where the capacity owner level is -1, which
// needs none), every $(VAR) in the args expanded, every binary built. A
// container the tier cannot run is listed with binary "-" and a reason.
func TestK8sTierSidecars(t *testing.T) {
	tier := readK8sTier(t)
	spec, ok := workloads(t, readObjects(t, "kubernetes"))["wasmcsi"]
	if !ok {
		t.Fatal("kubernetes: no workload wasmcsi")
	}
	build, err := os.ReadFile("../.ci/k8s/build.sh")
	if err != nil {
		t.Fatal(err)
	}
	built := regexp.MustCompile(`(?m)^sidecar_bins="([^"]*)"`).FindStringSubmatch(string(build))
	if built == nil {
		t.Fatal("build.sh: no sidecar_bins")
	}
	var names []string
	for _, c := range spec.Containers {
		if c.Name == "wasmcsi" {
			continue
		}
		names = append(names, c.Name)
		bin, ok := tier.binaries[c.Name]
		if !ok {
			t.Errorf("container %s of daemonset.yaml does not run in the tier", c.Name)
			continue
		}
		if bin != "-" && !slices.Contains(strings.Fields(built[1]), bin) {
			t.Errorf("container %s: build.sh does not build %s", c.Name, bin)
		}
		for _, o := range append(slices.Clone(tier.overrides["*"]), tier.overrides[c.Name]...) {
			f, _, _ := strings.Cut(o, "=")
			if _, ok := flag(c.Args, strings.TrimPrefix(f, "--")); !ok {
				t.Errorf("container %s: the tier changes %s, which its args %q lack", c.Name, f, c.Args)
			}
		}
		if v, ok := flag(c.Args, "http-endpoint"); ok && !regexp.MustCompile(`^:[0-9]+$`).MatchString(v) {
			t.Errorf("container %s: --http-endpoint=%s: the tier rewrites only :PORT to 127.0.0.1:PORT", c.Name, v)
		}
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				continue
			}
			if _, ok := tier.env[e.Name]; ok {
				continue
			}
			if e.Name == "POD_NAME" && slices.Contains(tier.overrides[c.Name], "--capacity-ownerref-level=-1") {
				continue
			}
			t.Errorf("container %s: env %s is not set by the tier", c.Name, e.Name)
		}
		for _, a := range c.Args {
			for _, m := range regexp.MustCompile(`\$\(([A-Z_]+)\)`).FindAllStringSubmatch(a, -1) {
				if _, ok := tier.env[m[1]]; !ok || !strings.Contains(tier.script, `v=${v//\$(`+m[1]+`)/`) {
					t.Errorf("container %s: arg %s: the tier does not expand $(%s)", c.Name, a, m[1])
				}
			}
		}
	}
	for c := range tier.binaries {
		if !slices.Contains(names, c) {
			t.Errorf("the tier runs %s, which daemonset.yaml has no container for", c)
		}
	}
}

// TestK8sTierPodImages checks that the pods mode of the Kubernetes tier
// (.ci/k8s/pods.sh) has an image for every sidecar container the chart's
// DaemonSet runs: a binary that build.sh builds, packed under the image
// name the chart renders.
func TestK8sTierPodImages(t *testing.T) {
	b, err := os.ReadFile("../.ci/k8s/pods.sh")
	if err != nil {
		t.Fatal(err)
	}
	binaries := map[string]string{}
	for _, f := range table(t, string(b), "K8S_TIER_IMAGES", "sidecar_binaries") {
		if len(f) != 2 {
			t.Fatalf("sidecar_binaries line %q: want container binary", f)
		}
		binaries[f[0]] = f[1]
	}
	build, err := os.ReadFile("../.ci/k8s/build.sh")
	if err != nil {
		t.Fatal(err)
	}
	built := regexp.MustCompile(`(?m)^sidecar_bins="([^"]*)"`).FindStringSubmatch(string(build))
	if built == nil {
		t.Fatal("build.sh: no sidecar_bins")
	}
	spec, ok := workloads(t, readObjects(t, "kubernetes"))["wasmcsi"]
	if !ok {
		t.Fatal("kubernetes: no workload wasmcsi")
	}
	for _, c := range spec.Containers {
		if c.Name == "wasmcsi" {
			continue
		}
		bin, ok := binaries[c.Name]
		switch {
		case !ok:
			t.Errorf("container %s (%s): pods.sh makes no image for it", c.Name, c.Image)
		case !slices.Contains(strings.Fields(built[1]), bin):
			t.Errorf("container %s: build.sh does not build %s", c.Name, bin)
		}
	}
}
