package modules

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// backing is a guest memory's address space: one anonymous mapping of the
// module's whole cap, made inaccessible and without swap reservation, whose
// prefix is opened for reading and writing as the memory grows. The memory
// never moves, so a grow copies nothing, pages cost RSS only once the guest
// touches them, and munmap gives them all back at once.
type backing struct {
	mem       []byte
	committed int
}

func newBacking(max int) (*backing, error) {
	if max == 0 {
		return &backing{}, nil
	}
	mem, err := unix.Mmap(-1, 0, max, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	return &backing{mem: mem}, nil
}

func (b *backing) max() int { return len(b.mem) }

// commit makes the first size bytes usable and returns them.
func (b *backing) commit(size int) ([]byte, error) {
	if size > b.committed {
		if err := unix.Mprotect(b.mem[b.committed:size], unix.PROT_READ|unix.PROT_WRITE); err != nil {
			return nil, fmt.Errorf("mprotect: %w", err)
		}
		b.committed = size
	}
	return b.mem[:size:size], nil
}

func (b *backing) release() {
	if b.mem != nil {
		_ = unix.Munmap(b.mem)
		b.mem, b.committed = nil, 0
	}
}
