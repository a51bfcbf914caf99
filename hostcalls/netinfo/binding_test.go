package netinfo

import (
	"context"
	"slices"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// call runs host call name of Bindings with req encoded, as the runtime
// does, and decodes the answer into resp.
func call(t *testing.T, name string, req hostcalls.Message, resp hostcalls.Message) error {
	t.Helper()
	for _, f := range Bindings() {
		if f.Name != name {
			continue
		}
		if f.Family != Family {
			t.Fatalf("%s: family %q, want %q", name, f.Family, Family)
		}
		out, err := f.Call(context.Background(), &hostcalls.Env{Module: "test"}, req.AppendWire(nil))
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

func TestBindingRouteTo(t *testing.T) {
	var r abi.NetRoute
	if err := call(t, abi.HostCallNetRouteTo, &abi.NetRouteToRequest{IP: "127.0.0.1"}, &r); err != nil {
		t.Fatal(err)
	}
	if r != (abi.NetRoute{Interface: "lo", Src: "127.0.0.1"}) {
		t.Fatalf("route to 127.0.0.1 = %+v, want lo from 127.0.0.1", r)
	}
	for _, bad := range []string{"", "localhost", "1.2.3", "fe80::1%lo"} {
		if err := call(t, abi.HostCallNetRouteTo, &abi.NetRouteToRequest{IP: bad}, &r); abi.CodeOf(err) != abi.InvalidArgument {
			t.Errorf("route to %q: %v, want INVALID_ARGUMENT", bad, err)
		}
	}
}

func TestBindingInterfaces(t *testing.T) {
	var ifs abi.NetInterfaces
	if err := call(t, abi.HostCallNetInterfaces, &abi.Empty{}, &ifs); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ifs.Interfaces, func(n abi.NetInterface) bool { return n.Loopback })
	if i < 0 {
		t.Fatalf("no loopback interface in %+v", ifs.Interfaces)
	}
	if lo := ifs.Interfaces[i]; !lo.Up || !slices.Contains(lo.Addrs, "127.0.0.1/8") {
		t.Fatalf("loopback = %+v, want up with 127.0.0.1/8", lo)
	}
}
