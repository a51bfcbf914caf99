package nfsd

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// fixture is a Server on temporary paths whose exportfs records its runs.
func fixture(t *testing.T) (*Server, *[]string, *hostcalls.Env, string) {
	t.Helper()
	dir := t.TempDir()
	pool := filepath.Join(dir, "pool")
	if err := os.MkdirAll(filepath.Join(pool, "v-a"), 0o755); err != nil {
		t.Fatal(err)
	}
	runs := &[]string{}
	s := &Server{Dir: filepath.Join(dir, "exports.d"), Etab: filepath.Join(dir, "etab"), Threads: filepath.Join(dir, "threads"),
		Run: func(_ context.Context, args ...string) error {
			*runs = append(*runs, strings.Join(args, " "))
			return nil
		}}
	env := &hostcalls.Env{Module: "nfs", Roots: []string{pool, "192.0.2.0/24", "fd00::/64", "198.51.100.7"}}
	return s, runs, env, pool
}

func call[Req, Resp any, PReq interface {
	*Req
	abi.Message
}, PResp interface {
	*Resp
	abi.Message
}](t *testing.T, s *Server, env *hostcalls.Env, name string, req PReq) (PResp, error) {
	t.Helper()
	for _, f := range Bindings(s) {
		if f.Name == name {
			out, err := f.Call(context.Background(), env, req.AppendWire(nil))
			if err != nil {
				return nil, err
			}
			resp := PResp(new(Resp))
			if err := resp.UnmarshalWire(out); err != nil {
				t.Fatal(err)
			}
			return resp, nil
		}
	}
	t.Fatalf("no host call %s", name)
	return nil, nil
}

func TestExportRecordsExactlyTheClients(t *testing.T) {
	s, runs, env, pool := fixture(t)
	vol := filepath.Join(pool, "v-a")
	if _, err := call[abi.NfsdExportRequest, abi.NfsdExport](t, s, env, abi.HostCallNfsdExport,
		&abi.NfsdExportRequest{Path: vol}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(s.Dir, "wasmcsi-nfs.exports"))
	if err != nil {
		t.Fatal(err)
	}
	// No client: the record alone, no export line (a line without a
	// client would export the folder to everyone).
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "/") {
			t.Fatalf("an export without clients wrote an export line: %q", line)
		}
	}
	for _, c := range []string{"192.0.2.9", "192.0.2.8", "fd00::5"} {
		if _, err := call[abi.NfsdClientRequest, abi.NfsdExport](t, s, env, abi.HostCallNfsdClientAdd,
			&abi.NfsdClientRequest{Path: vol, Client: abi.NfsdClient{Address: c}}); err != nil {
			t.Fatal(err)
		}
	}
	e, err := call[abi.NfsdClientRequest, abi.NfsdExport](t, s, env, abi.HostCallNfsdClientRemove,
		&abi.NfsdClientRequest{Path: vol, Client: abi.NfsdClient{Address: "192.0.2.9"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Clients) != 2 || e.Clients[0].Address != "192.0.2.8" || e.Clients[1].Address != "fd00::5" {
		t.Fatalf("clients after removal: %+v", e.Clients)
	}
	got, err := s.Load("nfs")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Path != vol || len(got[0].Clients) != 2 {
		t.Fatalf("records: %+v", got)
	}
	b, _ = os.ReadFile(filepath.Join(s.Dir, "wasmcsi-nfs.exports"))
	want := vol + " 192.0.2.8(" + Options(vol, false) + ") fd00::5(" + Options(vol, false) + ")"
	if !strings.Contains(string(b), want+"\n") || strings.Contains(string(b), "192.0.2.9") || strings.Contains(string(b), "*") {
		t.Fatalf("exports file:\n%s\nwant the line %s", b, want)
	}
	if len(*runs) != 5 {
		t.Errorf("exportfs ran %d times, want once per change (5): %v", len(*runs), *runs)
	}
	for _, r := range *runs {
		if r != "-r" {
			t.Errorf("exportfs %s, want -r", r)
		}
	}
	// Unexport forgets it and the file goes.
	if _, err := call[abi.NfsdRequest, abi.Empty](t, s, env, abi.HostCallNfsdUnexport, &abi.NfsdRequest{Path: vol}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.Dir, "wasmcsi-nfs.exports")); !os.IsNotExist(err) {
		t.Errorf("exports file after the last unexport: %v", err)
	}
	if _, err := call[abi.NfsdRequest, abi.Empty](t, s, env, abi.HostCallNfsdUnexport, &abi.NfsdRequest{Path: vol}); err != nil {
		t.Errorf("repeated unexport: %v", err)
	}
}

func TestExportConfined(t *testing.T) {
	s, runs, env, pool := fixture(t)
	vol := filepath.Join(pool, "v-a")
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(pool, "v-link")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, client string
		want         abi.Code
	}{
		{pool, "192.0.2.8", abi.PermissionDenied},                          // the root itself
		{outside, "192.0.2.8", abi.PermissionDenied},                       // outside the roots
		{filepath.Join(pool, "v-link"), "192.0.2.8", abi.PermissionDenied}, // a link out
		{filepath.Join(pool, "v-none"), "192.0.2.8", abi.NotFound},
		{vol, "*", abi.InvalidArgument},
		{vol, "0.0.0.0/0", abi.InvalidArgument},
		{vol, "node1.example", abi.InvalidArgument},
		{vol, "@netgroup", abi.InvalidArgument},
		{vol, "203.0.113.1", abi.PermissionDenied},
		{vol, "192.0.0.0/16", abi.PermissionDenied}, // wider than the granted /24
		{vol, "198.51.100.8", abi.PermissionDenied},
		{pool + "/v a", "192.0.2.8", abi.InvalidArgument},
	} {
		_, err := call[abi.NfsdExportRequest, abi.NfsdExport](t, s, env, abi.HostCallNfsdExport,
			&abi.NfsdExportRequest{Path: tc.path, Clients: []abi.NfsdClient{{Address: tc.client}}})
		if abi.CodeOf(err) != tc.want {
			t.Errorf("export %s to %s: %v, want %v", tc.path, tc.client, err, tc.want)
		}
	}
	if len(*runs) != 0 {
		t.Errorf("refused exports ran exportfs: %v", *runs)
	}
	if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
		t.Errorf("refused exports wrote records: %v", err)
	}
	if _, err := call[abi.NfsdClientRequest, abi.NfsdExport](t, s, env, abi.HostCallNfsdClientAdd,
		&abi.NfsdClientRequest{Path: vol, Client: abi.NfsdClient{Address: "192.0.2.8"}}); abi.CodeOf(err) != abi.NotFound {
		t.Errorf("client add to no export: %v, want NotFound", err)
	}
}

func TestListAndActive(t *testing.T) {
	s, _, env, pool := fixture(t)
	vol := filepath.Join(pool, "v-a")
	if _, err := call[abi.NfsdExportRequest, abi.NfsdExport](t, s, env, abi.HostCallNfsdExport,
		&abi.NfsdExportRequest{Path: vol, Clients: []abi.NfsdClient{{Address: "192.0.2.8"}, {Address: "192.0.2.0/25", ReadOnly: true}}}); err != nil {
		t.Fatal(err)
	}
	l, err := call[abi.NfsdListRequest, abi.NfsdExports](t, s, env, abi.HostCallNfsdList, &abi.NfsdListRequest{Root: pool})
	if err != nil {
		t.Fatal(err)
	}
	if l.Running || l.Reason == "" || len(l.Exports) != 1 || l.Exports[0].Active || !l.Exports[0].Clients[0].ReadOnly {
		t.Fatalf("list with no server: %+v", l)
	}
	os.WriteFile(s.Threads, []byte("8\n"), 0o644)
	os.WriteFile(s.Etab, []byte(vol+"\t192.0.2.8(rw,sync)\n"+vol+"\t192.0.2.0/25(ro,sync)\n"), 0o644)
	l, err = call[abi.NfsdListRequest, abi.NfsdExports](t, s, env, abi.HostCallNfsdList, &abi.NfsdListRequest{Root: pool})
	if err != nil {
		t.Fatal(err)
	}
	if !l.Running || !l.Exports[0].Active {
		t.Fatalf("list with the server serving it: %+v", l)
	}
	if _, err := call[abi.NfsdListRequest, abi.NfsdExports](t, s, env, abi.HostCallNfsdList, &abi.NfsdListRequest{Root: "/etc"}); abi.CodeOf(err) != abi.PermissionDenied {
		t.Errorf("list outside the roots: %v", err)
	}
}
