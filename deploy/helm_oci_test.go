package deploy

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A backend with an oci:// source comes from a registry: the daemon's
// configuration names it with the public key mounted from a ConfigMap or
// a Secret, and the init container does not install it from the image.
func TestHelmChartOCIModules(t *testing.T) {
	helm := helmBinary(t)
	src := "oci://registry.example.org/storage/localdir:1.0"
	if _, err := renderChartErr(helm, "wasmcsi", "--set", "nodeLocal.backends.localdir.source="+src); err == nil || !strings.Contains(err.Error(), "oci.publicKey") {
		t.Errorf("an OCI backend without a public key: %v", err)
	}
	if _, err := renderChartErr(helm, "wasmcsi", "--set", "nodeLocal.backends.localdir.source=registry.example.org/x:1"); err == nil || !strings.Contains(err.Error(), "source") {
		t.Errorf("a source without oci://: %v", err)
	}
	for _, tc := range []struct {
		name, set, workload, configKey string
		split                          bool
	}{
		{"configMap", "oci.publicKey.configMap=module-signer", "wasmcsi", "config.yaml", false},
		{"secret", "oci.publicKey.secret=module-signer", "wasmcsi", "config.yaml", false},
		{"split", "oci.publicKey.secret=module-signer", "wasmcsi-iscsi-controller", "controller.yaml", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flags := []string{"--set", tc.set, "--set", "oci.plainHTTP={registry.example.org}", "--set", "oci.authSecret=regcred"}
			l := layout{dir: "rendered", namespace: "wasmcsi", base: "/var/lib/wasmcsi", configMap: "wasmcsi-config"}
			if tc.split {
				flags = append(flags, "--set", "layout=split", "--set", "split.allowPlaceholderPortal=true", "--set", "split.controller.backends.iscsi.source="+src)
				l.configMap = "wasmcsi-iscsi-config"
			} else {
				flags = append(flags, "--set", "nodeLocal.backends.localdir.source="+src)
			}
			objs := renderChart(t, helm, "wasmcsi", flags...)
			spec, ok := workloads(t, objs)[tc.workload]
			if !ok {
				t.Fatalf("no workload %s", tc.workload)
			}
			var daemon, install container
			for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
				switch c.Name {
				case "wasmcsi":
					daemon = c
				case "install-modules":
					install = c
				}
			}
			cfg := loadConfig(t, configMapYAML(t, l, objs, tc.configKey), podEnviron(t, daemon))
			name := "localdir"
			if tc.split {
				name = "iscsi"
			}
			if got := cfg.Modules[name].Source; got != src {
				t.Errorf("module %s source %q, want %q", name, got, src)
			}
			if !slices.Equal(cfg.OCI.PlainHTTP, []string{"registry.example.org"}) {
				t.Errorf("plain_http %v", cfg.OCI.PlainHTTP)
			}
			checkInstalls(t, install.Command, cfg)
			// The key and the credentials are files in the daemon's
			// container, from the named objects.
			for file, object := range map[string]string{cfg.OCI.Key: "module-signer", cfg.OCI.AuthFile: "regcred"} {
				var mount *volumeMount
				for i, m := range daemon.VolumeMounts {
					if filepath.Dir(file) == m.MountPath {
						mount = &daemon.VolumeMounts[i]
					}
				}
				if mount == nil {
					t.Errorf("%s is in no mount of the daemon: %+v", file, daemon.VolumeMounts)
					continue
				}
				found := false
				for _, v := range spec.Volumes {
					if v.Name == mount.Name {
						found = v.Secret != nil && v.Secret.SecretName == object || v.ConfigMap != nil && v.ConfigMap.Name == object
					}
				}
				if !found {
					t.Errorf("volume %s of %s is not %s", mount.Name, file, object)
				}
			}
		})
	}
}
