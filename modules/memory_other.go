//go:build !linux

package modules

import "fmt"

// backing is a guest memory on the Go heap where no mmap is at hand (the
// daemon runs on Linux; this serves module tests elsewhere): a grow copies.
type backing struct {
	buf   []byte
	limit int
}

func newBacking(max int) (*backing, error) { return &backing{limit: max}, nil }

func (b *backing) max() int { return b.limit }

func (b *backing) commit(size int) ([]byte, error) {
	if size > b.limit {
		return nil, fmt.Errorf("%d bytes over the reservation of %d", size, b.limit)
	}
	if size > cap(b.buf) {
		grown := make([]byte, size, min(max(size, 2*cap(b.buf)), b.limit))
		copy(grown, b.buf)
		b.buf = grown
	}
	b.buf = b.buf[:size]
	return b.buf[:size:size], nil
}

func (b *backing) release() { b.buf = nil }
