package deploy

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/wasmcsi/wasmcsi/host/config"
)

// daemon is a wasmcsi workload of a layout: the role it serves and the key
// of the layout's ConfigMap it reads.
type daemon struct{ role, configKey string }

// layout is a deployment folder: its namespace, the service account of its
// sidecars, the host folder that holds its daemons' records, modules and
// pools, its ConfigMap and its daemons by workload name.
type layout struct {
	dir, namespace, serviceAccount, base, configMap string
	daemons                                         map[string]daemon
}

// The layouts under test: the node-local backends under driver
// wasmcsi.dev, and iscsi under its own driver in the split layout.
var layouts = []layout{
	{"kubernetes", "wasmcsi", "wasmcsi", "/var/lib/wasmcsi", "wasmcsi-config",
		map[string]daemon{"wasmcsi": {config.RoleAll, "config.yaml"}}},
	{"kubernetes-split", "wasmcsi-iscsi", "wasmcsi-iscsi", "/var/lib/wasmcsi-iscsi", "wasmcsi-iscsi-config",
		map[string]daemon{"wasmcsi-iscsi-controller": {config.RoleController, "controller.yaml"}, "wasmcsi-iscsi-node": {config.RoleNode, "node.yaml"}}},
}

const testNodeID = "node-a"

// object is one Kubernetes document; node keeps it for typed decoding.
type object struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string `yaml:"name"`
		Namespace string `yaml:"namespace"`
	} `yaml:"metadata"`
	file string
	node *yaml.Node
}

func (o object) decode(t *testing.T, v any) {
	t.Helper()
	if err := o.node.Decode(v); err != nil {
		t.Fatalf("%s: %s %s: %v", o.file, o.Kind, o.Metadata.Name, err)
	}
}

type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		FieldRef *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
		SecretKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"secretKeyRef"`
	} `yaml:"valueFrom"`
}

type volumeMount struct {
	Name             string `yaml:"name"`
	MountPath        string `yaml:"mountPath"`
	ReadOnly         bool   `yaml:"readOnly"`
	MountPropagation string `yaml:"mountPropagation"`
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []envVar `yaml:"env"`
	Ports   []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	SecurityContext *struct {
		Privileged bool `yaml:"privileged"`
	} `yaml:"securityContext"`
	VolumeMounts  []volumeMount `yaml:"volumeMounts"`
	LivenessProbe *struct {
		HTTPGet *struct {
			Path string `yaml:"path"`
			Port string `yaml:"port"`
		} `yaml:"httpGet"`
	} `yaml:"livenessProbe"`
}

type volume struct {
	Name     string `yaml:"name"`
	HostPath *struct {
		Path string `yaml:"path"`
		Type string `yaml:"type"`
	} `yaml:"hostPath"`
	ConfigMap *struct {
		Name string `yaml:"name"`
	} `yaml:"configMap"`
	Secret *struct {
		SecretName string `yaml:"secretName"`
	} `yaml:"secret"`
	EmptyDir any `yaml:"emptyDir"`
}

type podSpec struct {
	ServiceAccountName string      `yaml:"serviceAccountName"`
	HostNetwork        bool        `yaml:"hostNetwork"`
	InitContainers     []container `yaml:"initContainers"`
	Containers         []container `yaml:"containers"`
	Volumes            []volume    `yaml:"volumes"`
}

type workload struct {
	Spec struct {
		Template struct {
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// readDocs decodes every document of a YAML file.
func readDocs(t *testing.T, file string) []*yaml.Node {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []*yaml.Node
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		docs = append(docs, &n)
	}
}

// kustomization is the part of a kustomization.yaml the tests read.
type kustomization struct {
	Resources []string `yaml:"resources"`
	Images    []struct {
		Name    string `yaml:"name"`
		NewName string `yaml:"newName"`
		NewTag  string `yaml:"newTag"`
	} `yaml:"images"`
}

func readKustomization(t *testing.T, dir string) kustomization {
	t.Helper()
	var k kustomization
	docs := readDocs(t, filepath.Join(dir, "kustomization.yaml"))
	if len(docs) != 1 {
		t.Fatalf("%s/kustomization.yaml: %d documents", dir, len(docs))
	}
	if err := docs[0].Decode(&k); err != nil {
		t.Fatal(err)
	}
	return k
}

// readObjects returns the objects of a layout: its own files and, through
// directory resources, those of the layouts it builds on.
func readObjects(t *testing.T, dir string) []object {
	t.Helper()
	var objs []object
	for _, r := range readKustomization(t, dir).Resources {
		p := filepath.Join(dir, r)
		st, err := os.Stat(p)
		if err != nil {
			t.Fatalf("%s: resource %s: %v", dir, r, err)
		}
		if st.IsDir() {
			objs = append(objs, readObjects(t, p)...)
			continue
		}
		for _, n := range readDocs(t, p) {
			o := object{file: p, node: n}
			if err := n.Decode(&o); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			objs = append(objs, o)
		}
	}
	return objs
}

func find(objs []object, kind, name string) (object, bool) {
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Name == name {
			return o, true
		}
	}
	return object{}, false
}

func mustFind(t *testing.T, objs []object, kind, name string) object {
	t.Helper()
	o, ok := find(objs, kind, name)
	if !ok {
		t.Fatalf("no %s %q", kind, name)
	}
	return o
}

func (p podSpec) container(t *testing.T, name string) container {
	t.Helper()
	for _, c := range append(slices.Clone(p.Containers), p.InitContainers...) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return container{}
}

func (p podSpec) volume(name string) (volume, bool) {
	for _, v := range p.Volumes {
		if v.Name == name {
			return v, true
		}
	}
	return volume{}, false
}

// mountAt returns the mount of c at exactly path.
func (c container) mountAt(path string) (volumeMount, bool) {
	for _, m := range c.VolumeMounts {
		if m.MountPath == path {
			return m, true
		}
	}
	return volumeMount{}, false
}

func (c container) port(name string) int {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

func (c container) env(name string) (envVar, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e, true
		}
	}
	return envVar{}, false
}

// flag returns the value of --name=value among args.
func flag(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// workloads returns the Deployments and DaemonSets of a layout by name.
func workloads(t *testing.T, objs []object) map[string]podSpec {
	t.Helper()
	out := map[string]podSpec{}
	for _, o := range objs {
		if o.Kind == "DaemonSet" || o.Kind == "Deployment" {
			var w workload
			o.decode(t, &w)
			out[o.Metadata.Name] = w.Spec.Template.Spec
		}
	}
	return out
}

func driverName(t *testing.T, objs []object) string {
	t.Helper()
	for _, o := range objs {
		if o.Kind == "CSIDriver" {
			return o.Metadata.Name
		}
	}
	t.Fatal("no CSIDriver")
	return ""
}

// configMapYAML returns the daemon configuration under key in the
// layout's ConfigMap.
func configMapYAML(t *testing.T, l layout, objs []object, key string) string {
	t.Helper()
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	mustFind(t, objs, "ConfigMap", l.configMap).decode(t, &cm)
	s, ok := cm.Data[key]
	if !ok {
		t.Fatalf("ConfigMap %s has no %s", l.configMap, key)
	}
	return s
}

// loadConfig loads a configuration file the way `wasmcsi serve --config`
// does, with the given environment.
func loadConfig(t *testing.T, yamlText string, environ []string) *config.Config {
	t.Helper()
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(yamlText), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("wasmcsi", pflag.ContinueOnError)
	config.Flags(fs)
	if err := fs.Parse([]string{"--config", file}); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(fs, environ)
	if err != nil {
		t.Fatalf("the deployed configuration does not load: %v", err)
	}
	return cfg
}

// podEnviron turns a container's env into an environment as the kubelet
// would give it, with the downward API's node name set to testNodeID.
func podEnviron(t *testing.T, c container) []string {
	t.Helper()
	var env []string
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			env = append(env, e.Name+"="+testNodeID)
		case e.ValueFrom.FieldRef != nil:
			env = append(env, e.Name+"=x")
		case e.ValueFrom.SecretKeyRef != nil:
			env = append(env, e.Name+"=secret-"+e.ValueFrom.SecretKeyRef.Key)
		default:
			t.Fatalf("container %s: env %s: unexpected source", c.Name, e.Name)
		}
	}
	return env
}

func TestManifestsAreWellFormed(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.dir, func(t *testing.T) {
			objs := readObjects(t, l.dir)
			if len(objs) == 0 {
				t.Fatal("no objects")
			}
			seen := map[string]string{}
			for _, o := range objs {
				if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
					t.Errorf("%s: document without apiVersion, kind or name: %+v", o.file, o)
				}
				clusterScoped := slices.Contains([]string{"Namespace", "CSIDriver", "StorageClass", "VolumeSnapshotClass", "VolumeGroupSnapshotClass", "ClusterRole", "ClusterRoleBinding"}, o.Kind)
				if !clusterScoped && o.Metadata.Namespace != l.namespace {
					t.Errorf("%s: %s %s in namespace %q, want %q", o.file, o.Kind, o.Metadata.Name, o.Metadata.Namespace, l.namespace)
				}
				key := o.Kind + "/" + o.Metadata.Name
				if prev, dup := seen[key]; dup {
					t.Errorf("%s defined twice: %s and %s", key, prev, o.file)
				}
				seen[key] = o.file
			}
		})
	}
}

// Every manifest in kubernetes/ is listed, and every file listed exists
// (readObjects fails on a missing one).
func TestKustomizationListsEveryManifest(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.dir, func(t *testing.T) {
			listed := map[string]bool{}
			for _, r := range readKustomization(t, l.dir).Resources {
				listed[r] = true
			}
			files, err := filepath.Glob(filepath.Join(l.dir, "*.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range files {
				name := filepath.Base(f)
				if name != "kustomization.yaml" && !listed[name] {
					t.Errorf("%s is not listed in %s/kustomization.yaml", name, l.dir)
				}
			}
			readObjects(t, l.dir)
		})
	}
}

// Images are pinned in the kustomizations' images blocks, and every
// manifest carries the same tag, so `kubectl apply -f` and `-k` deploy the
// same versions.
func TestImagesArePinnedInOnePlace(t *testing.T) {
	base := readKustomization(t, "kubernetes")
	pins := map[string]string{}
	renamed := map[string]bool{} // kustomize rewrites these; the manifests keep the original
	for _, im := range base.Images {
		renamed[im.Name] = im.NewName != ""
		if im.NewTag == "" || im.NewTag == "latest" {
			t.Errorf("kubernetes/kustomization.yaml: %s is not pinned (tag %q)", im.Name, im.NewTag)
		}
		pins[im.Name] = im.NewTag
	}
	for _, l := range layouts {
		k := readKustomization(t, l.dir)
		if len(k.Images) != len(base.Images) {
			t.Errorf("%s/kustomization.yaml pins %d images, kubernetes/ pins %d", l.dir, len(k.Images), len(base.Images))
		}
		for _, im := range k.Images {
			if pins[im.Name] != im.NewTag {
				t.Errorf("%s/kustomization.yaml: %s:%s, kubernetes/ pins %q", l.dir, im.Name, im.NewTag, pins[im.Name])
			}
		}
		for name, spec := range workloads(t, readObjects(t, l.dir)) {
			for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
				i := strings.LastIndex(c.Image, ":")
				if i < 0 || strings.Contains(c.Image[i:], "/") {
					t.Errorf("%s/%s: image %q has no tag", name, c.Name, c.Image)
					continue
				}
				repo, tag := c.Image[:i], c.Image[i+1:]
				want, ok := pins[repo]
				if !ok {
					t.Errorf("%s/%s: image %s is not pinned in kubernetes/kustomization.yaml", name, c.Name, repo)
				} else if tag != want && !renamed[repo] {
					t.Errorf("%s/%s: image %s, kustomization pins %s", name, c.Name, c.Image, want)
				}
			}
		}
	}
}

// The configuration each daemon gets (ConfigMap + its environment) loads
// with the daemon's own loader, and everything it names is where the pod
// provides it.
func TestDaemonConfigMatchesPods(t *testing.T) {
	for _, l := range layouts {
		objs := readObjects(t, l.dir)
		driver := driverName(t, objs)
		specs := workloads(t, objs)
		for name, dm := range l.daemons {
			role := dm.role
			t.Run(l.dir+"/"+name, func(t *testing.T) {
				spec, ok := specs[name]
				if !ok {
					t.Fatalf("no workload %s", name)
				}
				d := spec.container(t, "wasmcsi")
				if want := []string{"serve", "--config", "/etc/wasmcsi/" + dm.configKey}; !slices.Equal(d.Args, want) {
					t.Errorf("wasmcsi args %q, want %q", d.Args, want)
				}
				checkMountedFrom(t, spec, d, "/etc/wasmcsi", func(v volume) bool {
					return v.ConfigMap != nil && v.ConfigMap.Name == l.configMap
				})
				if d.SecurityContext == nil || !d.SecurityContext.Privileged {
					t.Error("wasmcsi must run privileged")
				}

				cfg := loadConfig(t, configMapYAML(t, l, objs, dm.configKey), podEnviron(t, d))
				if cfg.Role != role {
					t.Errorf("role %q, want %q", cfg.Role, role)
				}
				if cfg.DriverName != driver {
					t.Errorf("driver_name %q, CSIDriver %q", cfg.DriverName, driver)
				}
				if cfg.NodeID != testNodeID {
					t.Errorf("node_id %q, want the node name from the downward API", cfg.NodeID)
				}
				if cfg.Endpoint != "unix:///csi/csi.sock" {
					t.Errorf("endpoint %q, want unix:///csi/csi.sock", cfg.Endpoint)
				}
				if _, ok := d.mountAt("/csi"); !ok {
					t.Error("the socket folder /csi is not mounted")
				}
				// Host folders are mounted at their own paths, so paths in
				// logs, records and loop backing files mean the same inside
				// and outside the pod; they are the layout's own, so that
				// layouts install side by side.
				for _, dir := range []string{cfg.StateDir, cfg.CacheDir, cfg.ModuleDir} {
					if !strings.HasPrefix(dir, l.base+"/") {
						t.Errorf("%s is not under the layout's folder %s", dir, l.base)
					}
				}
				for _, dir := range []string{cfg.StateDir, cfg.CacheDir} {
					m := checkHostPathAt(t, spec, d, dir)
					if m.ReadOnly {
						t.Errorf("%s is mounted read-only", dir)
					}
				}
				checkHostPathAt(t, spec, d, cfg.ModuleDir)
				for mod, g := range cfg.Modules {
					if len(g.HostCalls) == 0 {
						t.Errorf("module %s is granted no host calls", mod)
					}
					checkRoots(t, spec, d, l.base, role, mod, g.Roots)
				}

				// Probes and metrics.
				if got := portOf(t, cfg.MetricsAddress); got != d.port("metrics") {
					t.Errorf("metrics_address %q, container port metrics %d", cfg.MetricsAddress, d.port("metrics"))
				}
				// Unauthenticated metrics of a pod on the host's network
				// would be served on every interface of the node: such a
				// pod binds them to the loopback address.
				if host, _, _ := net.SplitHostPort(cfg.MetricsAddress); spec.HostNetwork && !net.ParseIP(host).IsLoopback() {
					t.Errorf("metrics_address %q of a pod on the host's network: want a loopback address", cfg.MetricsAddress)
				}
				probe := spec.container(t, "livenessprobe")
				if hp, _ := flag(probe.Args, "health-port"); hp != strconv.Itoa(d.port("healthz")) {
					t.Errorf("livenessprobe --health-port=%s, wasmcsi healthz port %d", hp, d.port("healthz"))
				}
				if d.LivenessProbe == nil || d.LivenessProbe.HTTPGet == nil || d.LivenessProbe.HTTPGet.Port != "healthz" {
					t.Error("wasmcsi has no liveness probe on the healthz port")
				}

				// Modules from the image reach the module folder: exactly
				// the granted ones, since a module without a grant is
				// refused at every start.
				init := spec.container(t, "install-modules")
				checkInstalls(t, init.Command, cfg)
				if m, ok := init.mountAt(cfg.ModuleDir); !ok || m.ReadOnly {
					t.Errorf("install-modules cannot write %s", cfg.ModuleDir)
				}

				// Node services: kubelet's folders with Bidirectional
				// propagation, /dev, and the registration socket.
				if role == config.RoleController {
					return
				}
				if m, ok := d.mountAt("/var/lib/kubelet"); !ok || m.MountPropagation != "Bidirectional" {
					t.Error("/var/lib/kubelet must be mounted with Bidirectional propagation")
				}
				checkHostPathAt(t, spec, d, "/var/lib/kubelet")
				checkHostPathAt(t, spec, d, "/dev")
				reg := spec.container(t, "node-driver-registrar")
				want := "/var/lib/kubelet/plugins/" + driver + "/csi.sock"
				if got, _ := flag(reg.Args, "kubelet-registration-path"); got != want {
					t.Errorf("--kubelet-registration-path=%s, want %s", got, want)
				}
				checkMountedFrom(t, spec, d, "/csi", func(v volume) bool {
					return v.HostPath != nil && v.HostPath.Path == path.Dir(want)
				})
			})
		}
	}
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("metrics_address %q: %v", addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("metrics_address %q: %v", addr, err)
	}
	return n
}

// checkMountedFrom checks that c mounts at path a volume that ok accepts.
func checkMountedFrom(t *testing.T, spec podSpec, c container, path string, ok func(volume) bool) {
	t.Helper()
	m, found := c.mountAt(path)
	if !found {
		t.Errorf("%s: nothing mounted at %s", c.Name, path)
		return
	}
	v, found := spec.volume(m.Name)
	if !found {
		t.Errorf("%s: mount %s names no volume %q", c.Name, path, m.Name)
		return
	}
	if !ok(v) {
		t.Errorf("%s: %s comes from the wrong volume %+v", c.Name, path, v)
	}
}

// checkHostPathAt checks that c mounts the host's path at the same path.
func checkHostPathAt(t *testing.T, spec podSpec, c container, path string) volumeMount {
	t.Helper()
	checkMountedFrom(t, spec, c, path, func(v volume) bool { return v.HostPath != nil && v.HostPath.Path == path })
	m, _ := c.mountAt(path)
	return m
}

// checkRoots checks a module's roots against the pod: the first is its
// pool under <base>/pools, mounted from the host at the same path (a node
// daemon may have none: it keeps no volumes); every absolute root (pool,
// devices, /dev/mapper names) lies in a host folder the daemon mounts at
// the same path. Roots without a slash are names (device-mapper or IQN
// prefixes, portals) and need no mount.
func checkRoots(t *testing.T, spec podSpec, d container, base, role, mod string, roots []string) {
	t.Helper()
	pool := base + "/pools/" + mod
	if role != config.RoleNode || len(roots) > 0 && strings.HasPrefix(roots[0], "/") {
		if len(roots) == 0 || roots[0] != pool {
			t.Errorf("module %s: first root of %q is not its pool %s", mod, roots, pool)
		}
		checkHostPathAt(t, spec, d, base+"/pools")
	}
	for _, r := range roots {
		if !strings.HasPrefix(r, "/") {
			continue
		}
		found := false
		for _, m := range d.VolumeMounts {
			v, ok := spec.volume(m.Name)
			if ok && v.HostPath != nil && v.HostPath.Path == m.MountPath && strings.HasPrefix(r, strings.TrimSuffix(m.MountPath, "/")+"/") {
				found = true
			}
		}
		if !found {
			t.Errorf("module %s: root %s is in no host folder the daemon mounts at the same path", mod, r)
		}
	}
}

// installedModules reads an install command, `cp [flags]
// --target-directory=DIR FILE...`, and returns DIR and the module names of
// the files (each must be a .wasm file in the image's module folder).
func installedModules(t *testing.T, cmd []string) (string, []string) {
	t.Helper()
	if slices.Equal(cmd, []string{"true"}) {
		return "", nil // every module comes from a registry
	}
	if len(cmd) == 0 || cmd[0] != "cp" {
		t.Errorf("install command %q is not cp", cmd)
		return "", nil
	}
	dir, _ := flag(cmd, "target-directory")
	var mods []string
	for _, a := range cmd[1:] {
		if strings.HasPrefix(a, "-") {
			continue
		}
		name, ok := strings.CutSuffix(strings.TrimPrefix(a, imageModuleDir(t)+"/"), ".wasm")
		if !ok || strings.Contains(name, "/") {
			t.Errorf("install command copies %s, not a module file of %s", a, imageModuleDir(t))
			continue
		}
		mods = append(mods, name)
	}
	slices.Sort(mods)
	return dir, mods
}

// checkInstalls checks that an install command copies into the daemon's
// module folder exactly the modules its configuration grants, each built
// into the image from examples/<name>.
func checkInstalls(t *testing.T, cmd []string, cfg *config.Config) {
	t.Helper()
	dir, mods := installedModules(t, cmd)
	if len(mods) > 0 && dir != cfg.ModuleDir {
		t.Errorf("install-modules copies to %q, module_dir is %s", dir, cfg.ModuleDir)
	}
	// Modules with a source come from a registry, not the image.
	var granted []string
	for _, name := range slices.Sorted(maps.Keys(cfg.Modules)) {
		if cfg.Modules[name].Source == "" {
			granted = append(granted, name)
		}
	}
	if !slices.Equal(mods, granted) {
		t.Errorf("install-modules installs %q, the configuration grants %q from the image", mods, granted)
	}
	for _, m := range mods {
		if _, err := os.Stat(filepath.Join("..", "examples", m, "main.go")); err != nil {
			t.Errorf("module %s is not built into the image (no examples/%s): %v", m, m, err)
		}
	}
}

var copyModulesRE = regexp.MustCompile(`(?m)^COPY --from=\S+ /out/modules/ (\S+?)/?$`)

// imageModuleDir is where the Dockerfile puts the modules in the image.
func imageModuleDir(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := copyModulesRE.FindSubmatch(data)
	if m == nil {
		t.Fatal("Dockerfile copies no modules into the image")
	}
	return string(m[1])
}

// The sidecars run in the mode their place needs: per node (distributed
// provisioning and snapshots, capacity owned by the DaemonSet) or central
// with leader election (capacity owned by the Deployment).
//
// Feature gates: Topology for node-local volumes, VolumeAttributesClass on
// the provisioner (mutable parameters at CreateVolume) and the resizer
// (ControllerModifyVolume when a PVC's class changes).
func TestSidecarModes(t *testing.T) {
	for _, tc := range []struct {
		dir, workload, container string
		args                     []string
		env                      []string
		gates                    []string
	}{
		{"kubernetes", "wasmcsi", "csi-provisioner",
			[]string{"--node-deployment=true", "--enable-capacity", "--capacity-ownerref-level=1"},
			[]string{"NODE_NAME", "NAMESPACE", "POD_NAME"}, []string{"Topology", "VolumeAttributesClass"}},
		{"kubernetes", "wasmcsi", "csi-snapshotter",
			[]string{"--node-deployment=true"}, []string{"NODE_NAME"}, []string{"CSIVolumeGroupSnapshot"}},
		// ListVolumes of a node's daemon names only that node's volumes,
		// and the monitor skips PVs it does not name: one per node.
		{"kubernetes", "wasmcsi", "csi-external-health-monitor-controller",
			nil, nil, nil},
		{"kubernetes", "wasmcsi", "csi-resizer",
			[]string{"--leader-election"}, []string{"NAMESPACE"}, []string{"VolumeAttributesClass"}},
		// iscsi has one pool for every node (storageCapacity: false).
		{"kubernetes-split", "wasmcsi-iscsi-controller", "csi-provisioner",
			[]string{"--leader-election"},
			[]string{"NAMESPACE", "POD_NAME"}, []string{"Topology", "VolumeAttributesClass"}},
		{"kubernetes-split", "wasmcsi-iscsi-controller", "csi-attacher",
			[]string{"--leader-election"}, []string{"NAMESPACE"}, nil},
		{"kubernetes-split", "wasmcsi-iscsi-controller", "csi-resizer",
			[]string{"--leader-election"}, []string{"NAMESPACE"}, []string{"VolumeAttributesClass"}},
		{"kubernetes-split", "wasmcsi-iscsi-controller", "csi-snapshotter",
			[]string{"--leader-election"}, []string{"NAMESPACE"}, []string{"CSIVolumeGroupSnapshot"}},
		{"kubernetes-split", "wasmcsi-iscsi-controller", "csi-external-health-monitor-controller",
			[]string{"--leader-election"}, []string{"NAMESPACE"}, nil},
	} {
		t.Run(tc.dir+"/"+tc.workload+"/"+tc.container, func(t *testing.T) {
			spec, ok := workloads(t, readObjects(t, tc.dir))[tc.workload]
			if !ok {
				t.Fatalf("no workload %s", tc.workload)
			}
			c := spec.container(t, tc.container)
			for _, a := range tc.args {
				if !slices.Contains(c.Args, a) {
					t.Errorf("args %q lack %s", c.Args, a)
				}
			}
			gates := featureGates(c.Args)
			for _, g := range tc.gates {
				if gates[g] != "true" {
					t.Errorf("args %q do not turn on feature gate %s", c.Args, g)
				}
			}
			if tc.dir == "kubernetes" && slices.Contains(c.Args, "--leader-election") && c.Name != "csi-resizer" {
				t.Error("a per-node sidecar must not take part in leader election")
			}
			if addr, _ := flag(c.Args, "csi-address"); addr != "/csi/csi.sock" {
				t.Errorf("--csi-address=%s, want /csi/csi.sock", addr)
			}
			for _, e := range tc.env {
				if _, ok := c.env(e); !ok {
					t.Errorf("env %s missing", e)
				}
			}
		})
	}
}

// featureGates collects the gates of every --feature-gates flag (each a
// comma-separated list of Name=value; later flags add to earlier ones, as
// the sidecars' flag parsing does).
func featureGates(args []string) map[string]string {
	out := map[string]string{}
	for _, a := range args {
		list, ok := strings.CutPrefix(a, "--feature-gates=")
		if !ok {
			continue
		}
		for _, g := range strings.Split(list, ",") {
			if name, value, ok := strings.Cut(strings.TrimSpace(g), "="); ok {
				out[name] = value
			}
		}
	}
	return out
}

// Every class names a backend its layout's controller grants, in the
// binding mode the backend's topology asks for, and every granted backend
// has a class; the snapshot classes name the layout's driver.
func TestStorageClasses(t *testing.T) {
	for _, tc := range []struct {
		l       layout
		binding string   // node-local volumes wait for the pod's node
		want    []string // backend/fstype of the classes expected
		groups  int      // VolumeGroupSnapshotClasses (see daemonset.yaml's csi-snapshotter)
	}{
		{layouts[0], "WaitForFirstConsumer", []string{"localdir/", "loopfile/ext4", "loopfile/xfs", "loopfile/", "dmthin/ext4"}, 0},
		{layouts[1], "Immediate", []string{"iscsi/ext4"}, 1},
	} {
		t.Run(tc.l.dir, func(t *testing.T) {
			objs := readObjects(t, tc.l.dir)
			driver := driverName(t, objs)
			key := ""
			for _, d := range tc.l.daemons {
				if d.role != config.RoleNode {
					key = d.configKey
				}
			}
			cfg := loadConfig(t, configMapYAML(t, tc.l, objs, key), []string{"WASMCSI_NODE_ID=" + testNodeID})
			fsTypes := map[string]bool{}
			backends := map[string]bool{}
			snapshotClasses, groupClasses := 0, 0
			for _, o := range objs {
				switch o.Kind {
				case "StorageClass":
					var sc struct {
						Provisioner          string            `yaml:"provisioner"`
						Parameters           map[string]string `yaml:"parameters"`
						AllowVolumeExpansion bool              `yaml:"allowVolumeExpansion"`
						VolumeBindingMode    string            `yaml:"volumeBindingMode"`
					}
					o.decode(t, &sc)
					if sc.Provisioner != driver {
						t.Errorf("%s: provisioner %q, want %q", o.Metadata.Name, sc.Provisioner, driver)
					}
					backend := sc.Parameters[cfg.BackendParameter]
					if _, granted := cfg.Modules[backend]; !granted {
						t.Errorf("%s: parameter %s=%q names no module granted in the config", o.Metadata.Name, cfg.BackendParameter, backend)
					}
					if !sc.AllowVolumeExpansion || sc.VolumeBindingMode != tc.binding {
						t.Errorf("%s: want allowVolumeExpansion and %s", o.Metadata.Name, tc.binding)
					}
					fs := sc.Parameters["csi.storage.k8s.io/fstype"]
					if fs != "" && fs != "ext4" && fs != "xfs" && fs != "btrfs" {
						t.Errorf("%s: fstype %q", o.Metadata.Name, fs)
					}
					fsTypes[backend+"/"+fs] = true
					backends[backend] = true
				case "VolumeSnapshotClass", "VolumeGroupSnapshotClass":
					if o.Kind == "VolumeSnapshotClass" {
						snapshotClasses++
					} else {
						groupClasses++
					}
					var vsc struct {
						Driver string `yaml:"driver"`
					}
					o.decode(t, &vsc)
					if vsc.Driver != driver {
						t.Errorf("%s %s: driver %q, want %q", o.Kind, o.Metadata.Name, vsc.Driver, driver)
					}
				}
			}
			for _, want := range tc.want {
				if !fsTypes[want] {
					t.Errorf("no StorageClass for %s", want)
				}
			}
			for m := range cfg.Modules {
				if !backends[m] {
					t.Errorf("backend %s is granted but no StorageClass offers it", m)
				}
			}
			if snapshotClasses != 1 || groupClasses != tc.groups {
				t.Errorf("%d VolumeSnapshotClasses, %d VolumeGroupSnapshotClasses; want 1 and %d", snapshotClasses, groupClasses, tc.groups)
			}
		})
	}
}

// The CSIDriver of each layout matches what its backends need: the
// node-local backends never attach and serve inline volumes; iscsi needs
// attachment (ControllerPublishVolume exports the LUN) and serves no
// inline volumes.
func TestCSIDriver(t *testing.T) {
	for _, tc := range []struct {
		l                         layout
		driver                    string
		attach, podInfo, capacity bool
		modes                     []string
	}{
		{layouts[0], "wasmcsi.dev", false, true, true, []string{"Persistent", "Ephemeral"}},
		{layouts[1], "iscsi.wasmcsi.dev", true, false, false, []string{"Persistent"}},
	} {
		t.Run(tc.l.dir, func(t *testing.T) {
			var d struct {
				Spec struct {
					AttachRequired       *bool    `yaml:"attachRequired"`
					PodInfoOnMount       *bool    `yaml:"podInfoOnMount"`
					VolumeLifecycleModes []string `yaml:"volumeLifecycleModes"`
					FSGroupPolicy        string   `yaml:"fsGroupPolicy"`
					StorageCapacity      *bool    `yaml:"storageCapacity"`
					RequiresRepublish    *bool    `yaml:"requiresRepublish"`
				} `yaml:"spec"`
			}
			objs := readObjects(t, tc.l.dir)
			if got := driverName(t, objs); got != tc.driver {
				t.Fatalf("driver %q, want %q", got, tc.driver)
			}
			mustFind(t, objs, "CSIDriver", tc.driver).decode(t, &d)
			is := func(p *bool, want bool) bool { return p != nil && *p == want }
			// Inline ephemeral volumes need podInfoOnMount: kubelet marks them
			// (csi.storage.k8s.io/ephemeral) only among the pod's information.
			if !is(d.Spec.AttachRequired, tc.attach) || !is(d.Spec.PodInfoOnMount, tc.podInfo) || !is(d.Spec.StorageCapacity, tc.capacity) || !is(d.Spec.RequiresRepublish, false) {
				t.Errorf("CSIDriver flags: %+v", d.Spec)
			}
			if !slices.Equal(d.Spec.VolumeLifecycleModes, tc.modes) || d.Spec.FSGroupPolicy != "File" {
				t.Errorf("CSIDriver modes %v, fsGroupPolicy %q", d.Spec.VolumeLifecycleModes, d.Spec.FSGroupPolicy)
			}
			// Attachment is needed exactly where a csi-attacher runs, and
			// capacity objects exactly where a provisioner publishes them.
			attacher, capacity := false, false
			for _, spec := range workloads(t, objs) {
				for _, c := range spec.Containers {
					attacher = attacher || c.Name == "csi-attacher"
					capacity = capacity || c.Name == "csi-provisioner" && slices.Contains(c.Args, "--enable-capacity")
				}
			}
			if attacher != tc.attach || capacity != tc.capacity {
				t.Errorf("csi-attacher running %v, capacity published %v; CSIDriver attachRequired %v, storageCapacity %v", attacher, capacity, tc.attach, tc.capacity)
			}
		})
	}
}

type rule struct {
	APIGroups []string `yaml:"apiGroups"`
	Resources []string `yaml:"resources"`
	Verbs     []string `yaml:"verbs"`
}

// The service account of the sidecars holds what each sidecar needs, and
// every binding and service account reference resolves.
func TestRBAC(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.dir, func(t *testing.T) {
			objs := readObjects(t, l.dir)
			roles := map[string][]rule{}
			for _, o := range objs {
				if o.Kind == "Role" || o.Kind == "ClusterRole" {
					var r struct {
						Rules []rule `yaml:"rules"`
					}
					o.decode(t, &r)
					roles[o.Kind+"/"+o.Metadata.Name] = r.Rules
				}
			}
			granted := map[string][]rule{} // service account -> rules
			for _, o := range objs {
				if o.Kind != "RoleBinding" && o.Kind != "ClusterRoleBinding" {
					continue
				}
				var b struct {
					RoleRef struct {
						Kind string `yaml:"kind"`
						Name string `yaml:"name"`
					} `yaml:"roleRef"`
					Subjects []struct {
						Kind      string `yaml:"kind"`
						Name      string `yaml:"name"`
						Namespace string `yaml:"namespace"`
					} `yaml:"subjects"`
				}
				o.decode(t, &b)
				rules, ok := roles[b.RoleRef.Kind+"/"+b.RoleRef.Name]
				if !ok {
					t.Errorf("%s %s: no %s %s", o.Kind, o.Metadata.Name, b.RoleRef.Kind, b.RoleRef.Name)
				}
				for _, s := range b.Subjects {
					if _, ok := find(objs, "ServiceAccount", s.Name); s.Kind != "ServiceAccount" || !ok || s.Namespace != l.namespace {
						t.Errorf("%s %s: subject %+v is not a service account of this layout", o.Kind, o.Metadata.Name, s)
					}
					granted[s.Name] = append(granted[s.Name], rules...)
				}
			}
			for name, spec := range workloads(t, objs) {
				if _, ok := find(objs, "ServiceAccount", spec.ServiceAccountName); !ok {
					t.Errorf("%s: service account %q is not defined", name, spec.ServiceAccountName)
				}
			}
			needs := []struct{ group, resource, verb, who string }{
				{"", "persistentvolumes", "create", "external-provisioner"},
				{"", "persistentvolumeclaims", "update", "external-provisioner"},
				{"storage.k8s.io", "csinodes", "get", "external-provisioner"},
				{"storage.k8s.io", "csistoragecapacities", "create", "external-provisioner --enable-capacity"},
				{"apps", "daemonsets", "get", "external-provisioner --capacity-ownerref-level=1"},
				{"apps", "replicasets", "get", "external-provisioner --capacity-ownerref-level=2"},
				{"coordination.k8s.io", "leases", "update", "leader election"},
				{"", "persistentvolumeclaims/status", "patch", "external-resizer"},
				{"snapshot.storage.k8s.io", "volumesnapshotcontents/status", "update", "csi-snapshotter"},
				{"groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "update", "csi-snapshotter"},
				{"groupsnapshot.storage.k8s.io", "volumegroupsnapshotclasses", "list", "csi-snapshotter"},
				{"", "persistentvolumes", "list", "external-health-monitor"},
				{"", "pods", "list", "external-health-monitor"},
				{"", "events", "create", "external-health-monitor"},
			}
			// The attacher's rules where it runs, and only there: no service
			// account holds rules for a sidecar it does not run.
			attacher := false
			for _, spec := range workloads(t, objs) {
				for _, c := range spec.Containers {
					attacher = attacher || c.Name == "csi-attacher"
				}
			}
			if attacher {
				needs = append(needs, struct{ group, resource, verb, who string }{"storage.k8s.io", "volumeattachments/status", "patch", "external-attacher"})
			} else if allows(granted[l.serviceAccount], "storage.k8s.io", "volumeattachments/status", "patch") {
				t.Errorf("service account %s holds the external-attacher's rules, but no csi-attacher runs", l.serviceAccount)
			}
			if allows(granted[l.serviceAccount], "cbt.storage.k8s.io", "snapshotmetadataservices", "get") {
				t.Errorf("service account %s holds the snapshot-metadata sidecar's rules, which the manifests do not run", l.serviceAccount)
			}
			for _, need := range needs {
				if !allows(granted[l.serviceAccount], need.group, need.resource, need.verb) {
					t.Errorf("service account %s may not %s %s.%s (needed by %s)", l.serviceAccount, need.verb, need.resource, need.group, need.who)
				}
			}
		})
	}
}

func allows(rules []rule, group, resource, verb string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

// The layouts install side by side: no object, driver name or host folder
// of one is the other's, and the pods on the host network (which may share
// a node) listen on distinct ports.
func TestLayoutsInstallSideBySide(t *testing.T) {
	// Host folders every node has, which daemons of both layouts read or
	// share by design (kubelet's, the initiator's, the kernel's).
	shared := []string{"/dev", "/sys", "/var/lib/kubelet", "/var/lib/kubelet/plugins_registry", "/etc/iscsi", "/var/lib/iscsi"}
	owner := map[string]string{}   // kind/namespace/name -> layout
	folders := map[string]string{} // host folder -> layout
	ports := map[int]string{}      // host-network port -> layout/workload/container
	drivers := map[string]string{}
	for _, l := range layouts {
		objs := readObjects(t, l.dir)
		d := driverName(t, objs)
		if prev, ok := drivers[d]; ok {
			t.Errorf("%s and %s both define driver %s", prev, l.dir, d)
		}
		drivers[d] = l.dir
		for _, o := range objs {
			key := o.Kind + "/" + o.Metadata.Namespace + "/" + o.Metadata.Name
			if prev, ok := owner[key]; ok && prev != l.dir {
				t.Errorf("%s is defined by %s and %s", key, prev, l.dir)
			}
			owner[key] = l.dir
		}
		for name, spec := range workloads(t, objs) {
			for _, v := range spec.Volumes {
				if v.HostPath == nil || slices.Contains(shared, v.HostPath.Path) {
					continue
				}
				for f, prev := range folders {
					if prev != l.dir && (f == v.HostPath.Path || strings.HasPrefix(f, v.HostPath.Path+"/") || strings.HasPrefix(v.HostPath.Path, f+"/")) {
						t.Errorf("host folder %s of %s overlaps %s of %s", v.HostPath.Path, l.dir, f, prev)
					}
				}
				folders[v.HostPath.Path] = l.dir
			}
			if !spec.HostNetwork {
				continue
			}
			for _, c := range spec.Containers {
				for _, p := range c.Ports {
					who := l.dir + "/" + name + "/" + c.Name
					if prev, ok := ports[p.ContainerPort]; ok {
						t.Errorf("host port %d: %s and %s", p.ContainerPort, prev, who)
					}
					ports[p.ContainerPort] = who
				}
			}
		}
	}
}

// kubectl's built-in kustomize renders both layouts; the split layout has
// no all-in-one DaemonSet and requires attachment.
func TestKustomizeBuild(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("needs kubectl (kubectl kustomize) in PATH: ", err)
	}
	for _, l := range layouts {
		t.Run(l.dir, func(t *testing.T) {
			out, err := exec.Command(kubectl, "kustomize", l.dir).Output()
			if err != nil {
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					t.Fatalf("kubectl kustomize %s: %v\n%s", l.dir, err, ee.Stderr)
				}
				t.Fatalf("kubectl kustomize %s: %v", l.dir, err)
			}
			file := filepath.Join(t.TempDir(), "rendered.yaml")
			if err := os.WriteFile(file, out, 0o600); err != nil {
				t.Fatal(err)
			}
			var rendered []object
			for _, n := range readDocs(t, file) {
				o := object{file: file, node: n}
				o.decode(t, &o)
				rendered = append(rendered, o)
			}
			specs := workloads(t, rendered)
			for name := range l.daemons {
				if _, ok := specs[name]; !ok {
					t.Errorf("rendered %s has no workload %s", l.dir, name)
				}
			}
			if len(specs) != len(l.daemons) {
				t.Errorf("rendered %s has workloads %v, want those of %v", l.dir, slices.Sorted(maps.Keys(specs)), l.daemons)
			}
			var d struct {
				Spec struct {
					AttachRequired bool `yaml:"attachRequired"`
				} `yaml:"spec"`
			}
			mustFind(t, rendered, "CSIDriver", driverName(t, rendered)).decode(t, &d)
			// Attachment is needed exactly where a csi-attacher runs.
			attacher := false
			for _, spec := range specs {
				for _, c := range spec.Containers {
					attacher = attacher || c.Name == "csi-attacher"
				}
			}
			if d.Spec.AttachRequired != attacher {
				t.Errorf("attachRequired %v, csi-attacher running %v", d.Spec.AttachRequired, attacher)
			}
		})
	}
}

// Nomad: the job's plugin, its configuration and the example volume agree.
func TestNomad(t *testing.T) {
	job, err := os.ReadFile("nomad/wasmcsi.nomad.hcl")
	if err != nil {
		t.Fatal(err)
	}
	vol, err := os.ReadFile("nomad/volume.hcl")
	if err != nil {
		t.Fatal(err)
	}
	attr := func(src []byte, block, key string) string {
		t.Helper()
		re := regexp.MustCompile(`(?s)` + block + `\s*\{[^}]*?\b` + regexp.QuoteMeta(key) + `\s*=\s*"([^"]*)"`)
		m := re.FindSubmatch(src)
		if m == nil {
			t.Fatalf("no %s in %s", key, block)
		}
		return string(m[1])
	}
	pluginID := nomadPluginID(t, job)
	mountDir := attr(job, "csi_plugin", "mount_dir")
	if attr(job, "csi_plugin", "type") != "monolith" || mountDir != "/csi" {
		t.Errorf("csi_plugin type=%s mount_dir=%s", attr(job, "csi_plugin", "type"), mountDir)
	}
	if !regexp.MustCompile(`(?m)^\s*type\s*=\s*"system"`).Match(job) || !regexp.MustCompile(`(?m)^\s*privileged\s*=\s*true`).Match(job) {
		t.Error("want a system job with a privileged plugin task")
	}
	// Nomad mounts the host's /dev into every CSI plugin task; a mount of the
	// job's own at /dev duplicates it.
	if regexp.MustCompile(`target\s*=\s*"/dev"`).Match(job) {
		t.Error("the job mounts /dev itself")
	}
	if m := regexp.MustCompile(`(?m)^plugin_id\s*=\s*"([^"]*)"`).FindSubmatch(vol); m == nil || string(m[1]) != pluginID {
		t.Errorf("volume.hcl names another plugin than the job's %q", pluginID)
	}

	data := regexp.MustCompile(`(?s)data\s*=\s*<<EOF\n(.*?)\nEOF`).FindSubmatch(job)
	if data == nil {
		t.Fatal("the job has no configuration template")
	}
	endpoint := attr(job, "env", "CSI_ENDPOINT")
	cfg := loadConfig(t, string(data[1]), []string{"CSI_ENDPOINT=" + endpoint, "WASMCSI_NODE_ID=" + testNodeID})
	if cfg.SocketPath() != path.Join(mountDir, "csi.sock") {
		t.Errorf("socket %s is not in the plugin's mount_dir %s", cfg.SocketPath(), mountDir)
	}
	if !regexp.MustCompile(`WASMCSI_NODE_ID\s*=\s*"\$\{node\.unique\.name\}"`).Match(job) {
		t.Error("WASMCSI_NODE_ID is not the Nomad node name")
	}
	mounted := map[string]bool{}
	for _, m := range regexp.MustCompile(`destination\s*=\s*"([^"]+)"`).FindAllSubmatch(job, -1) {
		mounted[string(m[1])] = true
	}
	for _, dir := range []string{cfg.StateDir, cfg.CacheDir, cfg.ModuleDir, "/var/lib/wasmcsi/pools"} {
		if !mounted[dir] {
			t.Errorf("%s is not a volume_mount destination of the job", dir)
		}
	}
	install := regexp.MustCompile(`(?s)task\s+"install-modules"\s*\{.*?entrypoint\s*=\s*\["cp"\]\s*args\s*=\s*\[(.*?)\]`).FindSubmatch(job)
	if install == nil {
		t.Fatal("no install-modules task running cp")
	}
	cmd := []string{"cp"}
	for _, m := range regexp.MustCompile(`"([^"]*)"`).FindAllSubmatch(install[1], -1) {
		cmd = append(cmd, string(m[1]))
	}
	checkInstalls(t, cmd, cfg)

	// Same grants as on Kubernetes, and the example names one of them.
	k8s := loadConfig(t, configMapYAML(t, layouts[0], readObjects(t, "kubernetes"), "config.yaml"), nil)
	for name, g := range k8s.Modules {
		n, ok := cfg.Modules[name]
		if !ok || !slices.Equal(n.HostCalls, g.HostCalls) || !slices.Equal(n.Roots, g.Roots) {
			t.Errorf("module %s: Nomad grant %+v, Kubernetes grant %+v", name, n, g)
		}
	}
	backend := regexp.MustCompile(`"` + regexp.QuoteMeta(cfg.BackendParameter) + `"\s*=\s*"([^"]+)"`).FindSubmatch(vol)
	if backend == nil {
		t.Fatalf("volume.hcl sets no %s parameter", cfg.BackendParameter)
	}
	if _, ok := cfg.Modules[string(backend[1])]; !ok {
		t.Errorf("volume.hcl names backend %q, which the job does not grant", backend[1])
	}
}

// nomadPluginID checks that a Nomad job names its plugin and itself after
// var.node (one plugin id per client: Nomad sends controller calls to any
// controller of a plugin id, and the backends are node-local) and returns
// the id of the single-client default.
func nomadPluginID(t *testing.T, job []byte) string {
	t.Helper()
	m := regexp.MustCompile(`plugin_id\s*=\s*var\.node\s*==\s*""\s*\?\s*"([^"]+)"\s*:\s*"([^"]+)"`).FindSubmatch(job)
	if m == nil {
		t.Fatal("no local plugin_id derived from var.node")
	}
	if string(m[2]) != string(m[1])+"-${var.node}" {
		t.Errorf("per-client plugin id %q is not %q", m[2], string(m[1])+"-${var.node}")
	}
	for _, re := range []string{
		`(?s)job\s+"[^"]+"\s*\{\s*id\s*=\s*local\.plugin_id\b`,
		`(?s)csi_plugin\s*\{[^}]*\bid\s*=\s*local\.plugin_id\b`,
		`(?s)constraint\s*\{\s*attribute\s*=\s*"\$\{node\.unique\.name\}"\s*operator\s*=\s*var\.node\s*==\s*""\s*\?\s*"is_set"\s*:\s*"="\s*value\s*=\s*var\.node\s*\}`,
	} {
		if !regexp.MustCompile(re).Match(job) {
			t.Errorf("the job does not match %s", re)
		}
	}
	return string(m[1])
}

// Nomad without Docker: the raw_exec job runs the same daemon with the same
// grants, tells Nomad the host paths it stages and publishes under, and
// names its plugin as the container job does.
func TestNomadRawExec(t *testing.T) {
	raw, err := os.ReadFile("nomad/wasmcsi-raw.nomad.hcl")
	if err != nil {
		t.Fatal(err)
	}
	job, err := os.ReadFile("nomad/wasmcsi.nomad.hcl")
	if err != nil {
		t.Fatal(err)
	}
	if id := nomadPluginID(t, raw); id != nomadPluginID(t, job) {
		t.Errorf("raw_exec plugin id %q, container plugin id %q", id, nomadPluginID(t, job))
	}
	for _, re := range []string{
		`driver\s*=\s*"raw_exec"`,
		`(?s)csi_plugin\s*\{[^}]*\btype\s*=\s*"monolith"`,
		// raw_exec has no filesystem isolation: staging and target paths
		// must be the host's, below the client's data_dir.
		`(?s)csi_plugin\s*\{[^}]*\bstage_publish_base_dir\s*=\s*"\$\{var\.nomad_data_dir\}/client/csi/monolith/\$\{local\.plugin_id\}"`,
		`args\s*=\s*\["serve", "--config", "\$\{NOMAD_TASK_DIR\}/config\.yaml"\]`,
		`WASMCSI_NODE_ID\s*=\s*"\$\{node\.unique\.name\}"`,
	} {
		if !regexp.MustCompile(re).Match(raw) {
			t.Errorf("the raw_exec job does not match %s", re)
		}
	}
	if regexp.MustCompile(`CSI_ENDPOINT\s*=`).Match(raw) {
		t.Error("the raw_exec job sets CSI_ENDPOINT: Nomad sets it to the socket's host path")
	}

	// The template, with the variables' defaults, is a configuration the
	// daemon loads, granting what the container job grants.
	defaults := map[string]string{}
	for _, m := range regexp.MustCompile(`(?s)variable\s+"([^"]+)"\s*\{[^}]*?default\s*=\s*"([^"]*)"`).FindAllSubmatch(raw, -1) {
		defaults["${var."+string(m[1])+"}"] = string(m[2])
	}
	data := regexp.MustCompile(`(?s)data\s*=\s*<<-EOT\n(.*?)\n\s*EOT`).FindSubmatch(raw)
	if data == nil {
		t.Fatal("the raw_exec job has no configuration template")
	}
	text := regexp.MustCompile(`\$\{var\.[a-z_]+\}`).ReplaceAllStringFunc(string(data[1]), func(v string) string {
		d, ok := defaults[v]
		if !ok {
			t.Errorf("the template uses %s, which has no default", v)
		}
		return d
	})
	lines := strings.Split(text, "\n")
	indent := len(lines[0]) - len(strings.TrimLeft(lines[0], " "))
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, strings.Repeat(" ", indent))
	}
	cfg := loadConfig(t, strings.Join(lines, "\n"), []string{"CSI_ENDPOINT=unix:///tmp/csi.sock", "WASMCSI_NODE_ID=" + testNodeID})
	if cfg.ModuleDir != defaults["${var.module_dir}"] || !strings.HasPrefix(cfg.StateDir, defaults["${var.root}"]+"/") {
		t.Errorf("module_dir %s, state_dir %s: not the job's variables", cfg.ModuleDir, cfg.StateDir)
	}
	cdata := regexp.MustCompile(`(?s)data\s*=\s*<<EOF\n(.*?)\nEOF`).FindSubmatch(job)
	if cdata == nil {
		t.Fatal("the container job has no configuration template")
	}
	ccfg := loadConfig(t, string(cdata[1]), []string{"CSI_ENDPOINT=unix:///csi/csi.sock", "WASMCSI_NODE_ID=" + testNodeID})
	if len(cfg.Modules) != len(ccfg.Modules) {
		t.Errorf("raw_exec grants %d modules, the container job %d", len(cfg.Modules), len(ccfg.Modules))
	}
	for name, g := range ccfg.Modules {
		r, ok := cfg.Modules[name]
		if !ok || !slices.Equal(r.HostCalls, g.HostCalls) || len(r.Roots) != len(g.Roots) {
			t.Errorf("module %s: raw_exec grant %+v, container grant %+v", name, r, g)
		}
	}
}
