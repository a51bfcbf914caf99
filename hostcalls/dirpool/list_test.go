package dirpool_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// listAll pages through dir_list with limit and returns every name.
func listAll(t *testing.T, env *hostcalls.Env, pool string, limit int64) []string {
	t.Helper()
	var all []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > 100000 {
			t.Fatal("dir_list never ends")
		}
		var page abi.ListPage
		if err := hostCall(t, env, abi.HostCallDirList, &abi.ListRequest{Pool: pool, After: after, Limit: limit}, &page); err != nil {
			t.Fatal(err)
		}
		if limit > 0 && int64(len(page.Names)) > limit {
			t.Fatalf("page of %d names, limit %d", len(page.Names), limit)
		}
		all = append(all, page.Names...)
		if page.Next == "" {
			return all
		}
		after = page.Next
	}
}

func TestDirList(t *testing.T) {
	root := t.TempDir()
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	for _, d := range []string{"v-c", "v-a", "v-e", "v-b", "v-d", ".tmp-copy"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Neither a file nor a symlink to a directory is a volume directory.
	if err := os.WriteFile(filepath.Join(root, "v-file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "v-a"), filepath.Join(root, "v-link")); err != nil {
		t.Fatal(err)
	}
	want := []string{"v-a", "v-b", "v-c", "v-d", "v-e"}
	var page abi.ListPage
	if err := hostCall(t, env, abi.HostCallDirList, &abi.ListRequest{Pool: root, Limit: 2}, &page); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(page.Names, want[:2]) || page.Next != "v-b" {
		t.Errorf("first page %+v, want [v-a v-b] and next v-b", page)
	}
	for _, limit := range []int64{0, 1, 2, 5, 6} {
		if got := listAll(t, env, root, limit); !slices.Equal(got, want) {
			t.Errorf("limit %d: %v, want %v", limit, got, want)
		}
	}

	for _, tc := range []struct {
		req  abi.ListRequest
		code abi.Code
	}{
		{abi.ListRequest{Pool: "/elsewhere"}, abi.PermissionDenied},
		{abi.ListRequest{Pool: root + "/v-a"}, abi.InvalidArgument}, // not a pool folder
		{abi.ListRequest{Pool: root, Limit: -1}, abi.InvalidArgument},
	} {
		err := hostCall(t, env, abi.HostCallDirList, &tc.req, &abi.ListPage{})
		if abi.CodeOf(err) != tc.code {
			t.Errorf("%+v: %v, want %v", tc.req, err, tc.code)
		}
	}
}

// A page holds at most abi.ListPageMax names, whatever the request asks.
func TestDirListPageBounded(t *testing.T) {
	root := t.TempDir()
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	n := abi.ListPageMax + 3
	for i := range n {
		if err := os.Mkdir(filepath.Join(root, fmt.Sprintf("v-%05d", i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var page abi.ListPage
	if err := hostCall(t, env, abi.HostCallDirList, &abi.ListRequest{Pool: root, Limit: 1 << 40}, &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Names) != abi.ListPageMax || page.Next != page.Names[abi.ListPageMax-1] {
		t.Fatalf("%d names, next %q; want %d and the last one", len(page.Names), page.Next, abi.ListPageMax)
	}
	if got := listAll(t, env, root, 0); len(got) != n {
		t.Errorf("listed %d, want %d", len(got), n)
	}
}

// Names that exist for the whole listing are listed exactly once while
// other names come and go.
func TestDirListWhilePoolChanges(t *testing.T) {
	root := t.TempDir()
	env := &hostcalls.Env{Module: "test", Roots: []string{root}}
	var stable []string
	for i := range 200 {
		name := fmt.Sprintf("v-%03d", i*2)
		stable = append(stable, name)
		if err := os.Mkdir(filepath.Join(root, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p := filepath.Join(root, fmt.Sprintf("v-%03d", (i%200)*2+1))
			_ = os.Mkdir(p, 0o755)
			_ = os.Remove(p)
		}
	}()
	for range 20 {
		got := listAll(t, env, root, 7)
		var kept []string
		for _, n := range got {
			if slices.Contains(stable, n) {
				kept = append(kept, n)
			}
		}
		if !slices.Equal(kept, stable) || !slices.IsSorted(got) {
			t.Fatalf("listing while the pool changes: %d stable names of %d, sorted %v", len(kept), len(stable), slices.IsSorted(got))
		}
	}
	close(stop)
	wg.Wait()
}
