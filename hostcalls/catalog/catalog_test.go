package catalog

import (
	"strings"
	"testing"
)

// Every host call is named "<family>_<verb>" after the grant that allows it.
func TestNamesFollowFamilies(t *testing.T) {
	all := All()
	if len(all) == 0 {
		t.Fatal("no host calls")
	}
	for name, f := range all {
		if f.Name != name || !strings.HasPrefix(name, f.Family+"_") || f.Call == nil {
			t.Errorf("host call %q: family %q, name %q", name, f.Family, f.Name)
		}
	}
}
