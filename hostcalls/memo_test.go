package hostcalls

import (
	"context"
	"testing"
)

type stepKey struct{}

// TestMemo: one memo per operation, shared by the steps nested in it;
// none outside one, where storing is harmless and nothing is remembered.
func TestMemo(t *testing.T) {
	bare := context.Background()
	if MemoOf(bare) != nil {
		t.Fatal("a bare context carries a memo")
	}
	MemoOf(bare).Store("k", 1) // no memo: remembers nothing, and does not panic
	if _, ok := MemoOf(bare).Load("k"); ok {
		t.Fatal("a missing memo remembered a value")
	}

	op := WithMemo(bare)
	MemoOf(op).Store("k", 1)
	nested := WithMemo(context.WithValue(op, stepKey{}, "step"))
	if v, ok := MemoOf(nested).Load("k"); !ok || v != 1 {
		t.Fatalf("a nested step sees %v, %v; want the operation's memo", v, ok)
	}
	MemoOf(nested).Delete("k")
	if _, ok := MemoOf(op).Load("k"); ok {
		t.Fatal("a delete in a nested step did not reach the operation's memo")
	}
	if _, ok := MemoOf(WithMemo(bare)).Load("k"); ok {
		t.Fatal("two operations share a memo")
	}
}
