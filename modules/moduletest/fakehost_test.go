package moduletest_test

import (
	"context"
	"slices"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/modules/moduletest"
)

func TestFakeHostFuncs(t *testing.T) {
	fake := &moduletest.FakeHost{}
	fake.Handle("loop", abi.HostCallLoopDetach, func([]byte) ([]byte, error) { return nil, abi.Errorf(abi.NotFound, "no such device") })
	funcs := fake.Funcs()
	if len(funcs) != 1 {
		t.Fatalf("funcs %v, want only loop_detach", funcs)
	}
	f := funcs[abi.HostCallLoopDetach]
	if f.Name != abi.HostCallLoopDetach || f.Family != "loop" {
		t.Errorf("func %s in family %q, want loop_detach in loop", f.Name, f.Family)
	}
	if _, err := f.Call(context.Background(), nil, nil); abi.CodeOf(err) != abi.NotFound {
		t.Errorf("call: %v, want NOT_FOUND", err)
	}
	if got := fake.Calls(); !slices.Equal(got, []string{"loop_detach"}) {
		t.Errorf("calls %v", got)
	}
}
