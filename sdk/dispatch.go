package sdk

import "github.com/wasmcsi/wasmcsi/abi"

// Dispatch decodes req for op, calls the backend and encodes its answer.
// On failure it returns the error message and a non-OK code: an *abi.Error
// (also wrapped) keeps its code, any other error is INTERNAL, a request that does not decode
// is INVALID_ARGUMENT and an operation b does not implement UNIMPLEMENTED.
// The guest glue and native tests both go through Dispatch, so a module
// behaves the same in `go test` and in the daemon.
func Dispatch(b Backend, op abi.Op, req []byte) ([]byte, abi.Code) {
	if !Implements(b, op) {
		return []byte("operation " + string(op) + " is not implemented"), abi.Unimplemented
	}
	if op == abi.OpInfo {
		info := b.Info()
		if len(info.Ops) == 0 {
			info.Ops = Ops(b)
		}
		return info.AppendWire(nil), abi.OK
	}
	return dispatch(b, op, req) // ops_gen.go
}

func run[R any, PR interface {
	*R
	abi.Message
}](raw []byte, req PR, fn func(PR) (abi.Message, error)) ([]byte, abi.Code) {
	if err := req.UnmarshalWire(raw); err != nil {
		return []byte("bad request: " + err.Error()), abi.InvalidArgument
	}
	resp, err := fn(req)
	if err != nil {
		if e, ok := err.(*abi.Error); ok && e.Code != abi.OK && e.Code.Valid() {
			return []byte(e.Message), e.Code
		}
		// A wrapped *abi.Error (fmt.Errorf("...: %w", err)) keeps its code
		// too, as host-call errors do in the daemon.
		if c := abi.CodeOf(err); c != abi.OK && c != abi.Unknown && c.Valid() {
			return []byte(err.Error()), c
		}
		return []byte(err.Error()), abi.Internal
	}
	return resp.AppendWire(nil), abi.OK
}

func empty(err error) (abi.Message, error) { return &abi.Empty{}, err }

// nonNil turns a typed nil response into an empty message so that a
// backend returning (nil, nil) answers with zero values, not a crash.
func nonNil[T any, PT interface {
	*T
	abi.Message
}](resp PT, err error) (abi.Message, error) {
	if err != nil {
		return nil, err
	}
	if resp == nil {
		return PT(new(T)), nil
	}
	return resp, nil
}
