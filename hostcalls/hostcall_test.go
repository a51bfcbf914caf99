package hostcalls

import (
	"context"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

func TestConfine(t *testing.T) {
	roots := []string{"/pool/a", "/pool/b/"}
	for _, tc := range []struct {
		path      string
		allowRoot bool
		want      string
		code      abi.Code
	}{
		{"/pool/a/v1", false, "/pool/a/v1", abi.OK},
		{"/pool/a/x/../v1", false, "/pool/a/v1", abi.OK},
		{"/pool/b/v1", false, "/pool/b/v1", abi.OK},
		{"/pool/a", false, "", abi.PermissionDenied},
		{"/pool/a", true, "/pool/a", abi.OK},
		{"/pool/a/../c", false, "", abi.PermissionDenied},
		{"/pool/ab", false, "", abi.PermissionDenied},
		{"/etc/passwd", false, "", abi.PermissionDenied},
		{"pool/a/v1", false, "", abi.InvalidArgument},
		{"", false, "", abi.InvalidArgument},
	} {
		got, err := Confine(roots, tc.path, tc.allowRoot)
		if abi.CodeOf(err) != tc.code || got != tc.want {
			t.Errorf("Confine(%q, %v) = %q, %v; want %q, %s", tc.path, tc.allowRoot, got, err, tc.want, tc.code)
		}
	}
}

func TestPoolPath(t *testing.T) {
	env := &Env{Roots: []string{"/pool/a"}}
	if root, name, err := PoolPath(env, "/pool/a/v1", "file"); err != nil || root != "/pool/a" || name != "v1" {
		t.Errorf("PoolPath = %q %q %v", root, name, err)
	}
	for path, code := range map[string]abi.Code{
		"/pool/a/sub/v1": abi.InvalidArgument, // not directly in the pool
		"/pool/a":        abi.PermissionDenied,
		"/other/v1":      abi.PermissionDenied,
	} {
		if _, _, err := PoolPath(env, path, "file"); abi.CodeOf(err) != code {
			t.Errorf("PoolPath(%q): %v, want %s", path, err, code)
		}
	}
}

func TestTypedRejectsGarbage(t *testing.T) {
	called := false
	f := Typed("test", "test_x", func(ctx context.Context, env *Env, req *abi.DirRequest) (*abi.DirExists, error) {
		called = true
		return &abi.DirExists{Exists: req.Path == "/p"}, nil
	})
	if _, err := f.Call(context.Background(), &Env{}, []byte{0xff, 0xff, 0xff}); abi.CodeOf(err) != abi.InvalidArgument || called {
		t.Errorf("garbage request: %v (handler called: %v)", err, called)
	}
	out, err := f.Call(context.Background(), &Env{}, (&abi.DirRequest{Path: "/p"}).AppendWire(nil))
	var resp abi.DirExists
	if err != nil || resp.UnmarshalWire(out) != nil || !resp.Exists {
		t.Errorf("round trip: %v %v", err, resp)
	}
}

func TestPoolPair(t *testing.T) {
	env := &Env{Roots: []string{"/pool/a", "/pool/b"}}
	if root, src, dst, err := PoolPair(env, "/pool/a/v1", "/pool/a/v2", "file"); err != nil || root != "/pool/a" || src != "v1" || dst != "v2" {
		t.Errorf("PoolPair = %q %q %q %v", root, src, dst, err)
	}
	for _, tc := range []struct {
		src, dst string
		code     abi.Code
	}{
		{"/pool/a/v1", "/pool/b/v2", abi.InvalidArgument}, // two pools
		{"/pool/a/v1", "/etc/v2", abi.PermissionDenied},
		{"/pool/a/sub/v1", "/pool/a/v2", abi.InvalidArgument},
	} {
		if _, _, _, err := PoolPair(env, tc.src, tc.dst, "file"); abi.CodeOf(err) != tc.code {
			t.Errorf("PoolPair(%q, %q): %v, want %s", tc.src, tc.dst, err, tc.code)
		}
	}
}
