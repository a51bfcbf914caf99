package iscsi

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// callBinding runs host call name of Bindings(in) with req encoded, as the
// runtime does, and decodes the answer into resp.
func callBinding(t *testing.T, in *Initiator, roots []string, name string, req, resp hostcalls.Message) error {
	t.Helper()
	for _, f := range Bindings(in) {
		if f.Name != name {
			continue
		}
		if f.Family != Family {
			t.Fatalf("%s: family %q, want %q", name, f.Family, Family)
		}
		out, err := f.Call(context.Background(), &hostcalls.Env{Module: "test", Roots: roots}, req.AppendWire(nil))
		if err != nil {
			return err
		}
		if err := resp.UnmarshalWire(out); err != nil {
			t.Fatalf("%s: answer does not decode: %v", name, err)
		}
		return nil
	}
	t.Fatalf("no host call %s", name)
	return nil
}

func TestPortalGranted(t *testing.T) {
	roots := []string{"127.0.0.1", "[fd00::1]:3261", "192.0.2.0/24", "not a root", "2001:db8::/32"}
	tests := []struct {
		portal string
		ok     bool
	}{
		{"127.0.0.1:3260", true},
		{"127.0.0.1:3261", false},
		{"[fd00::1]:3261", true},
		{"[fd00::1]:3260", false},
		{"192.0.2.77:3260", true},
		{"192.0.2.77:860", true},
		{"192.0.3.1:3260", false},
		{"[2001:db8:5::1]:3260", true},
		{"[2001:db9::1]:3260", false},
	}
	for _, tc := range tests {
		if got := portalGranted(roots, netip.MustParseAddrPort(tc.portal)); got != tc.ok {
			t.Errorf("portalGranted(%s) = %v, want %v", tc.portal, got, tc.ok)
		}
	}
	if portalGranted(nil, netip.MustParseAddrPort("127.0.0.1:3260")) {
		t.Error("no roots granted a portal")
	}
}

func TestBindingLoginRescanLogout(t *testing.T) {
	f := newFake(t, fakeTarget{IQN: tIQN, Portal: tPortal, LUNs: []int{2}, Sectors: 4096,
		CHAP: &CHAP{User: "user1", Secret: "secret123456"}})
	in := f.initiator(t.TempDir())
	roots := []string{"127.0.0.0/8"}
	req := &abi.IscsiTarget{Portal: "127.0.0.1", IQN: tIQN, LUN: 2, ChapUser: "user1", ChapSecret: "secret123456"}

	if err := callBinding(t, in, []string{"192.0.2.1"}, abi.HostCallIscsiLogin, req, &abi.IscsiLoginResponse{}); abi.CodeOf(err) != abi.PermissionDenied {
		t.Fatalf("login to an ungranted portal = %v, want PERMISSION_DENIED", err)
	}
	if n := len(f.world().Calls); n != 0 {
		t.Fatalf("an ungranted login ran iscsiadm %d times", n)
	}
	wrong := *req
	wrong.ChapSecret = "wrong-secret-1"
	err := callBinding(t, in, roots, abi.HostCallIscsiLogin, &wrong, &abi.IscsiLoginResponse{})
	if abi.CodeOf(err) != abi.PermissionDenied || strings.Contains(err.Error(), "wrong-secret-1") {
		t.Fatalf("login with a wrong secret = %v, want PERMISSION_DENIED without the secret", err)
	}
	var login abi.IscsiLoginResponse
	if err := callBinding(t, in, roots, abi.HostCallIscsiLogin, req, &login); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(login.Device, f.opts.Dev+"/sd") {
		t.Fatalf("device %q", login.Device)
	}
	var rescan abi.IscsiRescanResponse
	if err := callBinding(t, in, roots, abi.HostCallIscsiRescan, req, &rescan); err != nil {
		t.Fatal(err)
	}
	if rescan.SizeBytes != 4096*512 {
		t.Fatalf("rescan size %d, want %d", rescan.SizeBytes, 4096*512)
	}
	if err := callBinding(t, in, roots, abi.HostCallIscsiLogout, req, &abi.Empty{}); err != nil {
		t.Fatal(err)
	}
	if ss := sessionsOf(t, in); len(ss) != 0 {
		t.Fatalf("sessions after logout: %+v", ss)
	}
	bad := *req
	bad.LUN = 300
	if err := callBinding(t, in, roots, abi.HostCallIscsiLogin, &bad, &abi.IscsiLoginResponse{}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("LUN 300: %v, want INVALID_ARGUMENT", err)
	}
}

func TestBindingInitiatorName(t *testing.T) {
	f := newFake(t)
	in := f.initiator(t.TempDir())
	// The name file does not exist yet: open-iscsi is not set up.
	err := callBinding(t, in, nil, abi.HostCallIscsiInitiatorName, &abi.Empty{}, &abi.IscsiInitiatorName{})
	if abi.CodeOf(err) != abi.FailedPrecondition {
		t.Fatalf("no name file: %v, want FAILED_PRECONDITION", err)
	}
	const name = "iqn.1993-08.org.debian:01:0123456789ab"
	if err := os.WriteFile(f.opts.InitiatorNameFile, []byte("## DO NOT EDIT\nInitiatorName="+name+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// No roots: the name is a fact about the node, not a granted resource.
	var got abi.IscsiInitiatorName
	if err := callBinding(t, in, nil, abi.HostCallIscsiInitiatorName, &abi.Empty{}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Name != name {
		t.Fatalf("initiator name %q, want %q", got.Name, name)
	}
	if n := len(f.world().Calls); n != 0 {
		t.Fatalf("reading the initiator name ran iscsiadm %d times", n)
	}
}
