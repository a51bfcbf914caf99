package logwrites

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// logBuilder writes a log the way the kernel lays it out: the super at
// sector 0, each entry's header in a sector of its own, its data after it.
type logBuilder struct {
	ss      int
	buf     []byte
	n       int // entries written
	counted int // entries the super counts
}

func newLog(ss int) *logBuilder { return &logBuilder{ss: ss, buf: make([]byte, ss)} }

func (b *logBuilder) entry(sector, nr uint64, flags Flags, mark string, data []byte) {
	hdr := make([]byte, b.ss)
	le := binary.LittleEndian
	le.PutUint64(hdr[0:], sector)
	le.PutUint64(hdr[8:], nr)
	le.PutUint64(hdr[16:], uint64(flags))
	le.PutUint64(hdr[24:], uint64(len(mark)))
	copy(hdr[entrySize:], mark)
	b.buf = append(b.buf, hdr...)
	b.buf = append(b.buf, data...)
	b.n++
	// The kernel rewrites the super after a FUA write or a mark.
	if flags&(FUA|Mark) != 0 {
		b.counted = b.n
	}
}

func (b *logBuilder) bytes() []byte {
	le := binary.LittleEndian
	le.PutUint64(b.buf[0:], Magic)
	le.PutUint64(b.buf[8:], Version)
	le.PutUint64(b.buf[16:], uint64(b.counted))
	le.PutUint32(b.buf[24:], uint32(b.ss))
	return b.buf
}

func fill(c byte, n int) []byte { return bytes.Repeat([]byte{c}, n) }

// The synthetic log and the disk it describes after each entry: replaying
// to any entry must give exactly that disk.
func TestReplaySyntheticLog(t *testing.T) {
	for _, ss := range []int{512, 4096} {
		t.Run(map[int]string{512: "sector512", 4096: "sector4096"}[ss], func(t *testing.T) {
			const disk = 8
			b := newLog(ss)
			want := [][]byte{} // the disk after each entry
			cur := make([]byte, disk*ss)
			step := func(sector, nr uint64, flags Flags, mark string, data []byte) {
				b.entry(sector, nr, flags, mark, data)
				switch {
				case flags&Discard != 0:
					copy(cur[int(sector)*ss:], make([]byte, int(nr)*ss))
				case flags&Mark == 0:
					copy(cur[int(sector)*ss:], data)
				}
				want = append(want, bytes.Clone(cur))
			}
			step(0, 2, 0, "", fill('a', 2*ss))            // 0 write
			step(4, 1, Metadata, "", fill('m', ss))       // 1 write
			step(0, 0, Flush, "", nil)                    // 2 flush
			step(0, 0, Mark, "acked-1", nil)              // 3 mark
			step(1, 1, Discard, "", nil)                  // 4 discard
			step(6, 2, FUA, "", fill('f', 2*ss))          // 5 fua
			step(2, 1, 0, "", fill('b', ss))              // 6 write
			step(3, 1, Flush, "", fill('c', ss))          // 7 flush with data
			step(0, 0, Mark, "acked-2", nil)              // 8 mark
			step(2, 1, 0, "", fill('d', ss))              // 9 write
			step(0, 0, Flush, "", nil)                    // 10 flush the super does not count
			raw := append(b.bytes(), fill(0xee, 3*ss)...) // stale bytes past the log
			if b.counted != 9 {
				t.Fatalf("builder counted %d", b.counted)
			}

			l, err := Open(bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			if l.SectorSize != int64(ss) || len(l.Entries) != 11 {
				t.Fatalf("sector size %d, %d entries; want %d, 11", l.SectorSize, len(l.Entries), ss)
			}
			if got := l.DurablePoints(); !equal(got, []int{2, 5, 7, 10}) {
				t.Errorf("durable points %v, want [2 5 7 10]", got)
			}
			if i := l.FindMark("acked-2", 0); i != 8 {
				t.Errorf("mark acked-2 at %d, want 8", i)
			}
			if i := l.FindMark("acked-1", 4); i != -1 {
				t.Errorf("mark acked-1 after entry 4 at %d, want -1", i)
			}
			if s := l.Entries[7].Flags.String(); s != "flush" {
				t.Errorf("entry 7 flags %q", s)
			}

			// From scratch to every entry, into a file (discards punch holes)
			// and into memory (discards write zeros).
			for to := 0; to <= len(l.Entries); to++ {
				img := filepath.Join(t.TempDir(), "img")
				f, err := os.Create(img)
				if err != nil {
					t.Fatal(err)
				}
				if err := f.Truncate(int64(disk * ss)); err != nil {
					t.Fatal(err)
				}
				if err := l.Replay(f, 0, to); err != nil {
					t.Fatal(err)
				}
				f.Close()
				got, _ := os.ReadFile(img)
				exp := make([]byte, disk*ss)
				if to > 0 {
					exp = want[to-1]
				}
				if !bytes.Equal(got, exp) {
					t.Errorf("file replayed to %d differs", to)
				}
			}
			// Step by step, as the tier moves from one point to the next.
			mem := &memDisk{b: make([]byte, disk*ss)}
			prev := 0
			for _, p := range l.DurablePoints() {
				if err := l.Replay(mem, prev, p+1); err != nil {
					t.Fatal(err)
				}
				prev = p + 1
				if !bytes.Equal(mem.b, want[p]) {
					t.Errorf("memory replayed to point %d differs", p)
				}
			}
		})
	}
}

func TestOpenRejects(t *testing.T) {
	good := newLog(512)
	good.entry(0, 1, FUA, "", fill('x', 512))
	good.entry(1, 1, FUA, "", fill('y', 512))
	raw := good.bytes()
	for name, c := range map[string]struct {
		raw  []byte
		want string
	}{
		"bad magic":   {append([]byte{1}, raw[1:]...), "not a dm-log-writes log"},
		"bad version": {func() []byte { r := bytes.Clone(raw); r[8] = 2; return r }(), "version 2"},
		"truncated":   {raw[:len(raw)-600], "entry 1 of 2"},
		"empty":       {nil, "super block"},
	} {
		if _, err := Open(bytes.NewReader(c.raw)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want %q", name, err, c.want)
		}
	}
	l, err := Open(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Replay(&memDisk{b: make([]byte, 1024)}, 1, 3); err == nil {
		t.Error("replay past the end: no error")
	}
}

type memDisk struct{ b []byte }

func (m *memDisk) WriteAt(p []byte, off int64) (int, error) { return copy(m.b[off:], p), nil }

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
