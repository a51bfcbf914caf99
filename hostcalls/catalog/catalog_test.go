package catalog

import (
	"strings"
	"testing"
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
