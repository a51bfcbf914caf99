//go:build wasip1 && !tinygo

package guest

// growHeap has nothing to do: the standard Go runtime sizes its heap from
// what it keeps (GOGC) and collects concurrently.
func growHeap() {}
