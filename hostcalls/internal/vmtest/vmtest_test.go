package vmtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestListsBuiltin(t *testing.T) {
	list := "kernel/drivers/md/dm-mod.ko\nkernel/fs/ext4/ext4.ko\nkernel/drivers/block/loop.ko\n"
	for name, want := range map[string]bool{"dm_mod": true, "ext4": true, "loop": true, "dm_thin_pool": false, "mod": false} {
		if got := listsBuiltin(strings.NewReader(list), name); got != want {
			t.Errorf("listsBuiltin(%q) = %v", name, got)
		}
	}
}

func TestModulePresent(t *testing.T) {
	sys := t.TempDir()
	// Loaded, or built in with parameters: a folder. Built in without
	// parameters: only modules.builtin tells. A file is not a module.
	if err := os.Mkdir(filepath.Join(sys, "dm_thin_pool"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sys, "dm_mod"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	builtin := filepath.Join(t.TempDir(), "modules.builtin")
	if err := os.WriteFile(builtin, []byte("kernel/drivers/scsi/iscsi_tcp.ko\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"dm_thin_pool": true, "dm-thin-pool": true, "iscsi_tcp": true, "dm_mod": false, "target_core_mod": false,
	} {
		if got := modulePresent(sys, builtin, name); got != want {
			t.Errorf("modulePresent(%q) = %v, want %v", name, got, want)
		}
	}
	if modulePresent(sys, filepath.Join(sys, "missing"), "iscsi_tcp") {
		t.Error("no modules.builtin still found a module")
	}
}

// Outside the tier, Require must skip (not pass, not fail) a test that
// needs a module this kernel lacks, and say why.
func TestRequireSkipsOutsideTheTier(t *testing.T) {
	t.Setenv(EnvVM, "")
	for _, modules := range [][]string{nil, {"wasmcsi_no_such_module"}} {
		skipped := false
		t.Run("inner", func(t *testing.T) {
			defer func() { skipped = t.Skipped() }()
			Require(t, modules...)
		})
		if !skipped {
			t.Errorf("Require(%v) did not skip outside the tier", modules)
		}
	}
}

func TestModuleDir(t *testing.T) {
	t.Setenv(EnvModuleDir, "")
	skipped := false
	t.Run("unset", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		ModuleDir(t)
	})
	if !skipped {
		t.Error("ModuleDir without the variable did not skip")
	}
	dir := t.TempDir()
	t.Setenv(EnvModuleDir, dir)
	if got := ModuleDir(t); got != dir {
		t.Errorf("ModuleDir = %q", got)
	}
}
