package dm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The DM ioctl ABI (include/uapi/linux/dm-ioctl.h): every command takes one
// buffer that starts with struct dm_ioctl and continues with the command's
// data at data_start. The kernel answers in the same buffer. We marshal the
// buffer by hand rather than through unix.DmIoctl so that the layout is
// spelled out once, checked by tests, and independent of Go struct padding.
const (
	headerSize = unix.SizeofDmIoctl      // 312: struct dm_ioctl, data aligned to 8
	specSize   = unix.SizeofDmTargetSpec // 40: struct dm_target_spec
	nameLen    = unix.DM_NAME_LEN        // 128, NUL included
	uuidLen    = unix.DM_UUID_LEN        // 129, NUL included
	typeLen    = unix.DM_MAX_TYPE_NAME   // 16, NUL included

	offVersion     = 0
	offDataSize    = 12
	offDataStart   = 16
	offTargetCount = 20
	offOpenCount   = 24
	offFlags       = 28
	offEventNr     = 32
	offDev         = 40
	offName        = 48
	offUUID        = offName + nameLen // 176

	// smallBuffer is enough for commands that return only the header;
	// listBuffer is where commands that return data start, doubling on
	// DM_BUFFER_FULL_FLAG.
	smallBuffer = headerSize + 64
	listBuffer  = 16 << 10
	maxBuffer   = 16 << 20
)

// Kernel flag bits the package uses (the same values as unix.DM_*_FLAG).
const (
	flagReadOnly       = unix.DM_READONLY_FLAG
	flagSuspend        = unix.DM_SUSPEND_FLAG
	flagExists         = 0x4 // DM_EXISTS_FLAG, output only
	flagStatusTable    = unix.DM_STATUS_TABLE_FLAG
	flagActivePresent  = unix.DM_ACTIVE_PRESENT_FLAG
	flagInactivePres   = unix.DM_INACTIVE_PRESENT_FLAG
	flagBufferFull     = unix.DM_BUFFER_FULL_FLAG
	flagNoFlush        = unix.DM_NOFLUSH_FLAG
	flagDataOut        = unix.DM_DATA_OUT_FLAG
	flagUUID           = unix.DM_UUID_FLAG
	flagDeferredRemove = unix.DM_DEFERRED_REMOVE
)

// udev cookie flags, carried in the upper 16 bits of event_nr and passed by
// the kernel to udev as DM_COOKIE. They are what libdevmapper sends when
// udev synchronisation is off (DM_DISABLE_UDEV=1): udev leaves
// /dev/mapper/<name> and subsystem (LVM) rules alone, and this package
// manages the node itself. Disk rules (by-uuid links) still run.
const (
	udevFlagsShift            = 16
	udevDisableDMRules        = 0x0001
	udevDisableSubsystemRules = 0x0002
	udevPrimarySource         = 0x0040
	udevCookie                = (udevDisableDMRules | udevDisableSubsystemRules | udevPrimarySource) << udevFlagsShift
)

// interfaceMajor is the DM ioctl interface version we speak, as 4.0.0: it
// asks for nothing newer than the first version-4 kernel offered, so every
// kernel with a 4.x interface accepts it.
const interfaceMajor = 4

// header is struct dm_ioctl in Go terms.
type header struct {
	Version     [3]uint32
	DataSize    uint32
	DataStart   uint32
	TargetCount uint32
	OpenCount   int32
	Flags       uint32
	EventNr     uint32
	Dev         uint64
	Name        string
	UUID        string
}

// request is one DM ioctl to issue: a header and the data after it.
type request struct {
	cmd         uintptr
	name        string
	flags       uint32
	eventNr     uint32
	targetCount uint32
	data        []byte
	// size is the buffer size to offer the kernel; at least the header
	// and data. Commands that return data offer more.
	size int
}

// marshal lays out the request's buffer.
func (r *request) marshal() ([]byte, error) {
	if len(r.name) >= nameLen {
		return nil, fmt.Errorf("name %q is longer than %d bytes", r.name, nameLen-1)
	}
	size := max(r.size, headerSize+len(r.data), headerSize)
	buf := make([]byte, size)
	h := header{
		Version:     [3]uint32{interfaceMajor, 0, 0},
		DataSize:    uint32(size),
		DataStart:   headerSize,
		TargetCount: r.targetCount,
		Flags:       r.flags,
		EventNr:     r.eventNr,
		Name:        r.name,
	}
	putHeader(buf, &h)
	copy(buf[headerSize:], r.data)
	return buf, nil
}

func putHeader(buf []byte, h *header) {
	ne := binary.NativeEndian
	for i, v := range h.Version {
		ne.PutUint32(buf[offVersion+4*i:], v)
	}
	ne.PutUint32(buf[offDataSize:], h.DataSize)
	ne.PutUint32(buf[offDataStart:], h.DataStart)
	ne.PutUint32(buf[offTargetCount:], h.TargetCount)
	ne.PutUint32(buf[offOpenCount:], uint32(h.OpenCount))
	ne.PutUint32(buf[offFlags:], h.Flags)
	ne.PutUint32(buf[offEventNr:], h.EventNr)
	ne.PutUint64(buf[offDev:], h.Dev)
	copy(buf[offName:offName+nameLen-1], h.Name)
	copy(buf[offUUID:offUUID+uuidLen-1], h.UUID)
}

func parseHeader(buf []byte) (header, error) {
	if len(buf) < headerSize {
		return header{}, fmt.Errorf("dm ioctl reply of %d bytes is shorter than its header", len(buf))
	}
	ne := binary.NativeEndian
	var h header
	for i := range h.Version {
		h.Version[i] = ne.Uint32(buf[offVersion+4*i:])
	}
	h.DataSize = ne.Uint32(buf[offDataSize:])
	h.DataStart = ne.Uint32(buf[offDataStart:])
	h.TargetCount = ne.Uint32(buf[offTargetCount:])
	h.OpenCount = int32(ne.Uint32(buf[offOpenCount:]))
	h.Flags = ne.Uint32(buf[offFlags:])
	h.EventNr = ne.Uint32(buf[offEventNr:])
	h.Dev = ne.Uint64(buf[offDev:])
	h.Name = cString(buf[offName : offName+nameLen])
	h.UUID = cString(buf[offUUID : offUUID+uuidLen])
	return h, nil
}

// reply is the kernel's answer: the header and the data area it filled.
type reply struct {
	header
	// data is buf[DataStart:]: offsets in the kernel's answers (the next
	// field of target specs and name lists) count from its start.
	data []byte
	// used is the length of data the kernel says it filled.
	used int
}

func parseReply(buf []byte) (reply, error) {
	h, err := parseHeader(buf)
	if err != nil {
		return reply{}, err
	}
	if h.DataStart < headerSize || int(h.DataStart) > len(buf) {
		return reply{}, fmt.Errorf("dm ioctl reply: data_start %d outside the %d-byte buffer", h.DataStart, len(buf))
	}
	r := reply{header: h, data: buf[h.DataStart:]}
	if h.DataSize > h.DataStart {
		r.used = min(int(h.DataSize-h.DataStart), len(r.data))
	}
	return r, nil
}

// ioctl issues one DM command on the control file descriptor, growing the
// buffer while the kernel reports DM_BUFFER_FULL_FLAG. The error is the raw
// errno; callers translate it with their own context.
func ioctl(fd int, r *request) (reply, error) {
	for {
		buf, err := r.marshal()
		if err != nil {
			return reply{}, err
		}
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), r.cmd, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
			return reply{}, e
		}
		rep, err := parseReply(buf)
		if err != nil {
			return reply{}, err
		}
		if rep.Flags&flagBufferFull == 0 {
			return rep, nil
		}
		if len(buf) >= maxBuffer {
			return reply{}, fmt.Errorf("dm ioctl reply does not fit in %d bytes", maxBuffer)
		}
		r.size = 2 * len(buf)
	}
}

// marshalTargets lays out a table for DM_TABLE_LOAD: each struct
// dm_target_spec is followed by its NUL-terminated parameters, padded to 8
// bytes; spec.next is the distance to the next spec (input side).
func marshalTargets(table []Target) ([]byte, error) {
	if err := validTable(table); err != nil {
		return nil, err
	}
	ne := binary.NativeEndian
	var out []byte
	for _, t := range table {
		params := len(t.Params) + 1
		padded := (params + 7) &^ 7
		spec := make([]byte, specSize+padded)
		ne.PutUint64(spec[0:], t.Start)
		ne.PutUint64(spec[8:], t.Length)
		ne.PutUint32(spec[16:], 0)
		ne.PutUint32(spec[20:], uint32(specSize+padded))
		copy(spec[24:24+typeLen-1], t.Type)
		copy(spec[specSize:], t.Params)
		out = append(out, spec...)
	}
	return out, nil
}

// rawSpec is one target of a DM_TABLE_STATUS answer.
type rawSpec struct {
	Start, Length uint64
	Type          string
	Text          string
}

// parseSpecs reads count target specs from a status or table answer. In
// answers spec.next counts from the start of the data area (output side).
func parseSpecs(data []byte, count uint32) ([]rawSpec, error) {
	ne := binary.NativeEndian
	out := make([]rawSpec, 0, count)
	off := 0
	for i := uint32(0); i < count; i++ {
		if off < 0 || off+specSize > len(data) {
			return nil, fmt.Errorf("dm status: target %d at offset %d outside the %d-byte answer", i, off, len(data))
		}
		s := data[off:]
		text := s[specSize:]
		end := bytes.IndexByte(text, 0)
		if end < 0 {
			return nil, fmt.Errorf("dm status: target %d text is not terminated", i)
		}
		out = append(out, rawSpec{
			Start:  ne.Uint64(s[0:]),
			Length: ne.Uint64(s[8:]),
			Type:   cString(s[24 : 24+typeLen]),
			Text:   string(text[:end]),
		})
		next := int(ne.Uint32(s[20:]))
		if i+1 < count && next <= off {
			return nil, fmt.Errorf("dm status: target %d points back to offset %d", i, next)
		}
		off = next
	}
	return out, nil
}

// nameEntry is one struct dm_name_list entry of DM_LIST_DEVICES.
type nameEntry struct {
	Dev  uint64
	Name string
}

// parseNameList reads the device list: entries of {u64 dev, u32 next,
// char name[]} where next is the distance to the following entry and 0 ends
// the list. A first entry with dev 0 means no devices.
func parseNameList(data []byte) ([]nameEntry, error) {
	ne := binary.NativeEndian
	var out []nameEntry
	off := 0
	for {
		if off+12 > len(data) {
			return nil, fmt.Errorf("dm list: entry at offset %d outside the %d-byte answer", off, len(data))
		}
		dev := ne.Uint64(data[off:])
		next := int(ne.Uint32(data[off+8:]))
		if dev == 0 && next == 0 && off == 0 {
			return nil, nil
		}
		name := data[off+12:]
		end := bytes.IndexByte(name, 0)
		if end < 0 {
			return nil, fmt.Errorf("dm list: name at offset %d is not terminated", off+12)
		}
		out = append(out, nameEntry{Dev: dev, Name: string(name[:end])})
		if next == 0 {
			return out, nil
		}
		if next < 12 {
			return nil, fmt.Errorf("dm list: entry at offset %d has next %d", off, next)
		}
		off += next
	}
}

// marshalMessage lays out struct dm_target_msg: the sector, then the
// NUL-terminated message.
func marshalMessage(sector uint64, msg string) []byte {
	out := make([]byte, 8+len(msg)+1)
	binary.NativeEndian.PutUint64(out, sector)
	copy(out[8:], msg)
	return out
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
