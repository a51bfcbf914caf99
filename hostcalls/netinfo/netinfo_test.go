package netinfo

import (
	"context"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// testNet is two fresh network namespaces joined by a veth pair:
//
//	a: wc0 192.0.2.1/24, 2001:db8::1/64, default via 192.0.2.2; lo up
//	b: wc1 192.0.2.2/24, 2001:db8::2/64
type testNet struct {
	a, b netns.NsHandle
}

// newTestNet builds testNet, skipping without root or network namespaces.
// Both namespaces vanish when their handles close at cleanup.
func newTestNet(t *testing.T) testNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and a veth pair")
	}
	// netns.New moves the calling thread; keep it until it is moved back.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatalf("current namespace: %v", err)
	}
	defer orig.Close()
	var tn testNet
	tn.a, err = netns.New()
	if err != nil {
		t.Skipf("needs network namespaces: %v", err)
	}
	t.Cleanup(func() { tn.a.Close() })
	tn.b, err = netns.New()
	if err != nil {
		netns.Set(orig)
		t.Fatalf("second namespace: %v", err)
	}
	t.Cleanup(func() { tn.b.Close() })
	if err := netns.Set(orig); err != nil {
		t.Fatalf("back to the original namespace: %v", err)
	}

	ha, err := netlink.NewHandleAt(tn.a)
	if err != nil {
		t.Fatal(err)
	}
	defer ha.Close()
	hb, err := netlink.NewHandleAt(tn.b)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "wc0"}, PeerName: "wc1", PeerNamespace: netlink.NsFd(int(tn.b))}
	if err := ha.LinkAdd(veth); err != nil {
		t.Skipf("needs veth support: %v", err)
	}
	setup := func(h *netlink.Handle, name string, addrs ...string) {
		t.Helper()
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			p := netip.MustParsePrefix(a)
			ipn := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
			// NODAD: usable at once, not "tentative" for a second.
			if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipn, Flags: unix.IFA_F_NODAD}); err != nil {
				t.Fatalf("add %s to %s: %v", a, name, err)
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	setup(ha, "lo")
	setup(ha, "wc0", "192.0.2.1/24", "2001:db8::1/64")
	setup(hb, "wc1", "192.0.2.2/24", "2001:db8::2/64")
	wc0, _ := ha.LinkByName("wc0")
	if err := ha.RouteAdd(&netlink.Route{LinkIndex: wc0.Attrs().Index, Gw: net.ParseIP("192.0.2.2")}); err != nil {
		t.Fatalf("default route: %v", err)
	}
	return tn
}

func openIn(t *testing.T, ns netns.NsHandle) *Namespace {
	t.Helper()
	n, err := OpenIn(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}

func TestInterfaces(t *testing.T) {
	tn := newTestNet(t)
	n := openIn(t, tn.a)
	ifs, err := n.Interfaces(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Interface{}
	for _, i := range ifs {
		byName[i.Name] = i
	}
	if len(ifs) != 2 {
		t.Fatalf("interfaces %+v: want lo and wc0 only", ifs)
	}
	lo := byName["lo"]
	if !lo.Up || !lo.Loopback || !slices.Contains(lo.Addrs, netip.MustParsePrefix("127.0.0.1/8")) {
		t.Fatalf("lo = %+v: want up, loopback, 127.0.0.1/8", lo)
	}
	wc0 := byName["wc0"]
	if !wc0.Up || !wc0.Running || wc0.Loopback || wc0.MTU != 1500 || len(wc0.HardwareAddr) != len("00:00:00:00:00:00") {
		t.Fatalf("wc0 = %+v: want up, running, MTU 1500, a MAC", wc0)
	}
	for _, want := range []string{"192.0.2.1/24", "2001:db8::1/64"} {
		if !slices.Contains(wc0.Addrs, netip.MustParsePrefix(want)) {
			t.Errorf("wc0 addresses %v lack %s", wc0.Addrs, want)
		}
	}
	if ifs[0].Index > ifs[1].Index {
		t.Fatalf("interfaces not ordered by index: %+v", ifs)
	}
}

func TestRouteTo(t *testing.T) {
	tn := newTestNet(t)
	a := openIn(t, tn.a)
	b := openIn(t, tn.b)
	tests := []struct {
		name    string
		ns      *Namespace
		dst     string
		iface   string
		src, gw string // "" = zero address
		code    abi.Code
	}{
		{"on link", a, "192.0.2.2", "wc0", "192.0.2.1", "", abi.OK},
		{"via the default gateway", a, "198.51.100.7", "wc0", "192.0.2.1", "192.0.2.2", abi.OK},
		{"IPv4-mapped IPv6 is IPv4", a, "::ffff:198.51.100.7", "wc0", "192.0.2.1", "192.0.2.2", abi.OK},
		{"loopback", a, "127.0.0.1", "lo", "127.0.0.1", "", abi.OK},
		{"local address", a, "192.0.2.1", "lo", "192.0.2.1", "", abi.OK},
		{"IPv6 on link", a, "2001:db8::2", "wc0", "2001:db8::1", "", abi.OK},
		{"IPv6 without a route", a, "2001:db8:1::9", "", "", "", abi.NotFound},
		{"other side, no default route", b, "198.51.100.7", "", "", "", abi.NotFound},
		{"other side, on link", b, "192.0.2.1", "wc1", "192.0.2.2", "", abi.OK},
		{"unspecified", a, "0.0.0.0", "", "", "", abi.InvalidArgument},
		{"zone", a, "fe80::1%wc0", "", "", "", abi.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tc.ns.RouteTo(context.Background(), netip.MustParseAddr(tc.dst))
			if abi.CodeOf(err) != tc.code {
				t.Fatalf("RouteTo(%s) = %+v, %v; want code %v", tc.dst, r, err, tc.code)
			}
			if tc.code != abi.OK {
				return
			}
			want := Route{Interface: tc.iface}
			if tc.src != "" {
				want.Src = netip.MustParseAddr(tc.src)
			}
			if tc.gw != "" {
				want.Gateway = netip.MustParseAddr(tc.gw)
			}
			if r != want {
				t.Fatalf("RouteTo(%s) = %+v, want %+v", tc.dst, r, want)
			}
		})
	}
	if _, err := a.RouteTo(context.Background(), netip.Addr{}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("RouteTo(zero) = %v, want INVALID_ARGUMENT", err)
	}
}

func TestCanceledContext(t *testing.T) {
	n, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := n.Interfaces(ctx); err == nil {
		t.Fatal("Interfaces with a canceled context succeeded")
	}
	if _, err := n.RouteTo(ctx, netip.MustParseAddr("127.0.0.1")); err == nil {
		t.Fatal("RouteTo with a canceled context succeeded")
	}
	// The caller's own namespace works without privileges.
	ifs, err := n.Interfaces(context.Background())
	if err != nil || len(ifs) == 0 {
		t.Fatalf("Interfaces in the current namespace = %v, %v", ifs, err)
	}
}

func BenchmarkRouteTo(b *testing.B) {
	n, err := Open()
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()
	dst := netip.MustParseAddr("127.0.0.1")
	for b.Loop() {
		if _, err := n.RouteTo(ctx, dst); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkInterfaces(b *testing.B) {
	n, err := Open()
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()
	for b.Loop() {
		if _, err := n.Interfaces(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
