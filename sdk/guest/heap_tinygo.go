//go:build wasip1 && tinygo

package guest

import "runtime"

// TinyGo's collector grows its heap only when a collection frees less than
// a third of it, so a module's heap stays a few dozen KiB above what it
// keeps alive, and a full collection (a conservative scan of the globals
// and the stack, 0.2-0.6 ms) ran every few dozen calls: more, spread over
// the calls, than the calls themselves cost. One allocation of
// heapHeadroom on the first call grows the heap once (TinyGo doubles the
// linear memory until it fits); the next collection frees it, and from
// then on collections come once per heapHeadroom of garbage. The cost is
// 1 MiB of memory per instance, which the daemon counts in the module's
// budget, and 1.5-2 ms more on an instance's first call. (In init the allocation would run at compile time, in TinyGo's
// interpreter of package initializers, and never reach the heap.)
const heapHeadroom = 256 << 10

var headroomDone bool

func growHeap() {
	if headroomDone {
		return
	}
	headroomDone = true
	b := make([]byte, heapHeadroom)
	runtime.KeepAlive(b)
}
