package catalog

import (
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Every host call is named "<family>_<verb>" after the grant that allows it.
func TestNamesFollowFamilies(t *testing.T) {
	all, err := New(Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for _, family := range []string{"dir", "mount", "file", "loop", "dm", "lio", "net", "iscsi"} {
		found := false
		for name, f := range all {
			if f.Family == family {
				found = true
			}
			if f.Name != name || !strings.HasPrefix(name, f.Family+"_") || f.Call == nil {
				t.Errorf("host call %q: family %q, name %q", name, f.Family, f.Name)
			}
		}
		if !found {
			t.Errorf("family %s missing", family)
		}
	}
	if _, ok := All()["iscsi_login"]; ok {
		t.Error("All() has the iscsi family without a state dir")
	}
}

// The daemon serves exactly the host calls abi declares (abi.HostCalls,
// generated from abi/hc_*.go), each under the family abi names.
func TestCatalogMatchesABI(t *testing.T) {
	all, err := New(Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range abi.HostCalls {
		f, ok := all[d.Name]
		switch {
		case !ok:
			t.Errorf("abi declares %s, the catalog does not serve it", d.Name)
		case f.Family != d.Family:
			t.Errorf("%s: catalog family %q, abi family %q", d.Name, f.Family, d.Family)
		}
	}
	if len(all) != len(abi.HostCalls) {
		declared := map[string]bool{}
		for _, d := range abi.HostCalls {
			declared[d.Name] = true
		}
		for name := range all {
			if !declared[name] {
				t.Errorf("the catalog serves %s, which abi does not declare", name)
			}
		}
	}
}

// TestDefersSyncs: exactly the families whose durable effects are their
// pool entries (or nothing) leave their folder syncs to a batch; dm, lio,
// iscsi and a name no family has do not.
func TestDefersSyncs(t *testing.T) {
	for f, want := range map[string]bool{"dir": true, "file": true, "loop": true, "mount": true, "net": true, "dm": false, "lio": false, "iscsi": false, "nosuch": false} {
		if got := DefersSyncs(f); got != want {
			t.Errorf("DefersSyncs(%q) = %v, want %v", f, got, want)
		}
	}
}
