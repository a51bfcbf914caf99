package state

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

// TestEphemeralRecords: an ephemeral record round-trips with every field,
// is replaced by a put of the same CO volume ID, survives a reopen (from
// the log, and from bbolt after a clean close), lists in ID order and is
// deleted once.
func TestEphemeralRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openQuiet(t, path)
	full := Ephemeral{
		COVolumeID: "csi-0123abcd", Phase: EphemeralPublishing, Backend: "loopfile",
		Name: "ephemeral-csi-0123abcd", Parameters: map[string]string{"prealloc": "true"}, RequiredBytes: 64 << 20,
		Capability: Capability{FsType: "xfs", MountFlags: []string{"noatime"}, AccessMode: 1},
		ReadOnly:   true, TargetPath: "/pods/p/volumes/v/mount", StagingPath: "/state/ephemeral/abc",
		VolumeID: "loopfile:ephemeral-csi-0123abcd-1f2e", CapacityBytes: 64 << 20,
		Context: map[string]string{"path": "/pool/x.img"}, CreatedAt: created,
	}
	other := Ephemeral{COVolumeID: "csi-00", Phase: EphemeralDeleting, Backend: "localdir"}
	for _, e := range []Ephemeral{{COVolumeID: full.COVolumeID, Phase: EphemeralPublishing}, full, other} {
		if err := s.PutEphemeral(e); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.GetEphemeral(full.COVolumeID); err != nil || !reflect.DeepEqual(got, full) {
		t.Fatalf("GetEphemeral = %+v, %v; want %+v", got, err, full)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openQuiet(t, path)
	got, err := s.ListEphemerals()
	if err != nil || len(got) != 2 || !reflect.DeepEqual(got[0], other) || !reflect.DeepEqual(got[1], full) {
		t.Fatalf("ListEphemerals after reopen = %+v, %v", got, err)
	}
	if err := s.DeleteEphemeral(other.COVolumeID); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteEphemeral(other.COVolumeID); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("second delete = %v, want NOT_FOUND", err)
	}
	if _, err := s.GetEphemeral(other.COVolumeID); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("get after delete = %v, want NOT_FOUND", err)
	}
	if err := s.PutEphemeral(Ephemeral{}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("put without an ID = %v, want INVALID_ARGUMENT", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
