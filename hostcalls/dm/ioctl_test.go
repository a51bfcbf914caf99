package dm

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The hand-written offsets must match the kernel's struct dm_ioctl, which
// x/sys generates from the uapi header.
func TestHeaderLayoutMatchesKernel(t *testing.T) {
	var d unix.DmIoctl
	for _, c := range []struct {
		name      string
		ours, sys uintptr
	}{
		{"version", offVersion, unsafe.Offsetof(d.Version)},
		{"data_size", offDataSize, unsafe.Offsetof(d.Data_size)},
		{"data_start", offDataStart, unsafe.Offsetof(d.Data_start)},
		{"target_count", offTargetCount, unsafe.Offsetof(d.Target_count)},
		{"open_count", offOpenCount, unsafe.Offsetof(d.Open_count)},
		{"flags", offFlags, unsafe.Offsetof(d.Flags)},
		{"event_nr", offEventNr, unsafe.Offsetof(d.Event_nr)},
		{"dev", offDev, unsafe.Offsetof(d.Dev)},
		{"name", offName, unsafe.Offsetof(d.Name)},
		{"uuid", offUUID, unsafe.Offsetof(d.Uuid)},
	} {
		if c.ours != c.sys {
			t.Errorf("offset of %s = %d, kernel has %d", c.name, c.ours, c.sys)
		}
	}
	if headerSize != unsafe.Sizeof(d) {
		t.Errorf("header size %d, kernel struct %d", headerSize, unsafe.Sizeof(d))
	}
	var s unix.DmTargetSpec
	if unsafe.Offsetof(s.Next) != 20 || unsafe.Offsetof(s.Target_type) != 24 || specSize != unsafe.Sizeof(s) {
		t.Errorf("dm_target_spec layout changed: next@%d type@%d size %d", unsafe.Offsetof(s.Next), unsafe.Offsetof(s.Target_type), unsafe.Sizeof(s))
	}
}

func TestRequestMarshal(t *testing.T) {
	r := &request{cmd: unix.DM_DEV_CREATE, name: "wasmcsi-a", flags: flagSuspend, eventNr: udevCookie, targetCount: 2, data: []byte("xyz"), size: 1024}
	buf, err := r.marshal()
	if err != nil {
		t.Fatal(err)
	}
	if len(buf) != 1024 {
		t.Fatalf("buffer %d bytes, want the 1024 asked", len(buf))
	}
	h, err := parseHeader(buf)
	if err != nil {
		t.Fatal(err)
	}
	want := header{Version: [3]uint32{4, 0, 0}, DataSize: 1024, DataStart: headerSize, TargetCount: 2, Flags: flagSuspend, EventNr: udevCookie, Name: "wasmcsi-a"}
	if h != want {
		t.Errorf("header %+v\nwant   %+v", h, want)
	}
	if !bytes.Equal(buf[headerSize:headerSize+3], []byte("xyz")) {
		t.Errorf("data not at data_start")
	}
	// udev flags sit in the cookie's upper half; the semaphore half is 0.
	if udevCookie&0xffff != 0 || udevCookie>>16 != 0x43 {
		t.Errorf("udev cookie %#x", udevCookie)
	}

	small, err := (&request{cmd: unix.DM_VERSION}).marshal()
	if err != nil || len(small) != headerSize {
		t.Errorf("header-only request: %d bytes, %v", len(small), err)
	}
	if _, err := (&request{name: strings.Repeat("n", nameLen)}).marshal(); err == nil {
		t.Error("a 128-byte name marshalled")
	}
}

func TestParseReply(t *testing.T) {
	buf := make([]byte, 1024)
	putHeader(buf, &header{DataStart: headerSize, DataSize: headerSize + 10, Dev: unix.Mkdev(253, 300), OpenCount: 2, Name: "x", UUID: "u"})
	copy(buf[headerSize:], "0123456789")
	rep, err := parseReply(buf)
	if err != nil {
		t.Fatal(err)
	}
	if rep.used != 10 || string(rep.data[:rep.used]) != "0123456789" || rep.OpenCount != 2 || rep.Name != "x" || rep.UUID != "u" {
		t.Errorf("reply %+v used %d", rep.header, rep.used)
	}
	if unix.Major(rep.Dev) != 253 || unix.Minor(rep.Dev) != 300 {
		t.Errorf("dev %d:%d", unix.Major(rep.Dev), unix.Minor(rep.Dev))
	}
	// No data: the kernel leaves data_size at offsetof(data) = 305.
	binary.NativeEndian.PutUint32(buf[offDataSize:], 305)
	if rep, _ = parseReply(buf); rep.used != 0 {
		t.Errorf("used %d for a header-only reply", rep.used)
	}
	binary.NativeEndian.PutUint32(buf[offDataStart:], 5000)
	if _, err := parseReply(buf); err == nil {
		t.Error("data_start past the buffer accepted")
	}
	if _, err := parseReply(buf[:100]); err == nil {
		t.Error("short reply accepted")
	}
}

func TestMarshalTargets(t *testing.T) {
	data, err := marshalTargets([]Target{
		{Start: 0, Length: 100, Type: "linear", Params: "7:0 0"},       // 6 bytes with NUL -> 8
		{Start: 100, Length: 28, Type: "zero"},                         // 1 -> 8
		{Start: 128, Length: 8, Type: "linear", Params: "7:1 1024000"}, // 12 -> 16
	})
	if err != nil {
		t.Fatal(err)
	}
	ne := binary.NativeEndian
	offs := []int{0, 48, 96}
	if len(data) != 96+specSize+16 {
		t.Fatalf("table is %d bytes, want %d", len(data), 96+specSize+16)
	}
	for i, c := range []struct {
		start, length uint64
		next          uint32
		typ, params   string
	}{
		{0, 100, 48, "linear", "7:0 0"},
		{100, 28, 48, "zero", ""},
		{128, 8, 56, "linear", "7:1 1024000"},
	} {
		s := data[offs[i]:]
		if ne.Uint64(s) != c.start || ne.Uint64(s[8:]) != c.length || ne.Uint32(s[20:]) != c.next {
			t.Errorf("spec %d: start %d length %d next %d", i, ne.Uint64(s), ne.Uint64(s[8:]), ne.Uint32(s[20:]))
		}
		if got := cString(s[24:40]); got != c.typ {
			t.Errorf("spec %d type %q", i, got)
		}
		if got := cString(s[specSize:]); got != c.params {
			t.Errorf("spec %d params %q", i, got)
		}
	}
	if _, err := marshalTargets([]Target{{Start: 1, Length: 1, Type: "zero"}}); err == nil {
		t.Error("a table not starting at 0 marshalled")
	}
}

// statusAnswer builds a DM_TABLE_STATUS answer the way the kernel does:
// spec.next counts from the start of the data area.
func statusAnswer(specs []rawSpec) []byte {
	ne := binary.NativeEndian
	var out []byte
	for _, s := range specs {
		spec := make([]byte, specSize)
		ne.PutUint64(spec, s.Start)
		ne.PutUint64(spec[8:], s.Length)
		copy(spec[24:], s.Type)
		text := append([]byte(s.Text), 0)
		for len(text)%8 != 0 {
			text = append(text, 0)
		}
		ne.PutUint32(spec[20:], uint32(len(out)+specSize+len(text)))
		out = append(append(out, spec...), text...)
	}
	return append(out, make([]byte, 64)...)
}

func TestParseSpecs(t *testing.T) {
	want := []rawSpec{
		{0, 2048, "thin-pool", "1 10/4096 0/8192 - rw discard_passdown queue_if_no_space - 1024"},
		{2048, 8, "error", ""},
		{2056, 1, "linear", "7:0 99"},
	}
	got, err := parseSpecs(statusAnswer(want), 3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("spec %d = %+v, want %+v", i, got[i], want[i])
		}
	}

	bad := []struct {
		name  string
		data  []byte
		count uint32
	}{
		{"truncated", statusAnswer(want)[:30], 1},
		{"more targets than data", statusAnswer(want[:1])[:specSize+90], 3},
		{"unterminated text", bytes.Repeat([]byte{'a'}, specSize+8), 1},
	}
	loop := statusAnswer(want[:2])
	binary.NativeEndian.PutUint32(loop[20:], 0) // first spec points at itself
	bad = append(bad, struct {
		name  string
		data  []byte
		count uint32
	}{"next points back", loop, 2})
	for _, c := range bad {
		if _, err := parseSpecs(c.data, c.count); err == nil {
			t.Errorf("%s: parsed", c.name)
		}
	}
}

func nameList(entries []nameEntry) []byte {
	ne := binary.NativeEndian
	var out []byte
	for i, e := range entries {
		rec := make([]byte, 12)
		ne.PutUint64(rec, e.Dev)
		rec = append(rec, e.Name...)
		rec = append(rec, 0)
		rec = append(rec, make([]byte, 8)...) // event_nr and flags, as newer kernels add
		for len(rec)%8 != 0 {
			rec = append(rec, 0)
		}
		if i+1 < len(entries) {
			ne.PutUint32(rec[8:], uint32(len(rec)))
		}
		out = append(out, rec...)
	}
	return append(out, make([]byte, 16)...)
}

func TestParseNameList(t *testing.T) {
	want := []nameEntry{{unix.Mkdev(253, 0), "wasmcsi-pool"}, {unix.Mkdev(253, 1), "wasmcsi-pool-1"}, {unix.Mkdev(253, 2), "x"}}
	got, err := parseNameList(nameList(want))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if got, err := parseNameList(make([]byte, 16)); err != nil || len(got) != 0 {
		t.Errorf("empty list: %v, %v", got, err)
	}
	if _, err := parseNameList(nameList(want)[:20]); err == nil {
		t.Error("truncated list parsed")
	}
	short := nameList(want)
	binary.NativeEndian.PutUint32(short[8:], 4)
	if _, err := parseNameList(short); err == nil {
		t.Error("next shorter than an entry parsed")
	}
}

func TestMarshalMessage(t *testing.T) {
	b := marshalMessage(7, "create_thin 3")
	if binary.NativeEndian.Uint64(b) != 7 || string(b[8:]) != "create_thin 3\x00" {
		t.Errorf("message %q", b)
	}
}
