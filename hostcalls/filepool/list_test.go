package filepool_test

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

func TestFileList(t *testing.T) {
	root := t.TempDir()
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	for _, f := range []string{"v-b.img", "v-a.img", "v-c.img", ".tmp-clone"} {
		if err := hostCall(t, env, abi.HostCallFileCreate, &abi.FileCreateRequest{Path: filepath.Join(root, f), SizeBytes: 1 << 20}, &abi.Empty{}); err != nil && f[0] != '.' {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, ".tmp-clone"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "v-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "v-a.img"), filepath.Join(root, "v-link")); err != nil {
		t.Fatal(err)
	}
	var page abi.ListPage
	if err := hostCall(t, env, abi.HostCallFileList, &abi.ListRequest{Pool: root, Limit: 2}, &page); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(page.Names, []string{"v-a.img", "v-b.img"}) || page.Next != "v-b.img" {
		t.Fatalf("first page %+v", page)
	}
	if err := hostCall(t, env, abi.HostCallFileList, &abi.ListRequest{Pool: root, After: page.Next, Limit: 2}, &page); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(page.Names, []string{"v-c.img"}) || page.Next != "" {
		t.Fatalf("second page %+v, want the last", page)
	}
	if err := hostCall(t, env, abi.HostCallFileList, &abi.ListRequest{Pool: "/elsewhere"}, &page); abi.CodeOf(err) != abi.PermissionDenied {
		t.Errorf("file_list outside the roots: %v, want PERMISSION_DENIED", err)
	}
}

// file_create never replaces a file (abi/ABI.md, section 3.2): of
// concurrent creations of one name with different sizes, one makes it and
// every other is ALREADY_EXISTS; the file keeps the winner's size.
func TestFileCreateNeverReplaces(t *testing.T) {
	root := t.TempDir()
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	path := filepath.Join(root, "v-claim")
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = hostCall(t, env, abi.HostCallFileCreate, &abi.FileCreateRequest{Path: path, SizeBytes: int64(i+1) << 20}, &abi.Empty{})
		}()
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner < 0:
			winner = i
		case err == nil:
			t.Errorf("two creations of one name succeeded with sizes %d and %d MiB", winner+1, i+1)
		case abi.CodeOf(err) != abi.AlreadyExists:
			t.Errorf("creation %d: %v, want ALREADY_EXISTS", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no creation succeeded")
	}
	var st abi.FileStat
	if err := hostCall(t, env, abi.HostCallFileStat, &abi.FileRequest{Path: path}, &st); err != nil || st.SizeBytes != int64(winner+1)<<20 {
		t.Errorf("file_stat %+v, %v; want the winner's %d MiB", st, err, winner+1)
	}
}
