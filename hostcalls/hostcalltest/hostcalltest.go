// Package hostcalltest runs host-call bindings the way a module does, for
// the bindings' own tests. It is for tests only.
package hostcalltest

import (
	"context"
	"testing"

	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Call finds the binding name among bindings, checks it belongs to family,
// runs it with req encoded as a module would and decodes the answer into
// resp. The binding's error is returned as it is; a missing binding, a
// wrong family or an undecodable answer fails the test.
func Call(t testing.TB, bindings []hostcalls.Func, family string, env *hostcalls.Env, name string, req, resp hostcalls.Message) error {
	t.Helper()
	return CallContext(t, context.Background(), bindings, family, env, name, req, resp)
}

// CallContext is Call under ctx, for bindings that read the operation's
// context (its memo, its deadline).
func CallContext(t testing.TB, ctx context.Context, bindings []hostcalls.Func, family string, env *hostcalls.Env, name string, req, resp hostcalls.Message) error {
	t.Helper()
	for _, f := range bindings {
		if f.Name != name {
			continue
		}
		if f.Family != family {
			t.Fatalf("%s has family %q, want %q", name, f.Family, family)
		}
		out, err := f.Call(ctx, env, req.AppendWire(nil))
		if err != nil {
			return err
		}
		if err := resp.UnmarshalWire(out); err != nil {
			t.Fatalf("%s answered undecodable bytes: %v", name, err)
		}
		return nil
	}
	t.Fatalf("no binding %s", name)
	return nil
}
