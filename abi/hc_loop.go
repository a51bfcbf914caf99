package abi

// Messages of the "loop" host calls: loop devices over files. The family's
// roots are folders whose files may back loop devices; a file is opened
// beneath its root without following symlinks, and loop_resize and
// loop_detach act only on devices whose backing file lies inside a root.
// A device stays attached until loop_detach, across daemon restarts.
// The codec is generated into hc_loop_wire.go. Field numbers are the wire
// contract: never renumber or reuse one.

// Host call names of the "loop" family.
const (
	// HostCallLoopAttach attaches a file inside a granted root to a loop device, or
	// answers the device it is already attached to.
	HostCallLoopAttach = "loop_attach" // LoopAttachRequest -> LoopDevice
	// HostCallLoopFind answers the device a file is attached to, if any.
	HostCallLoopFind = "loop_find" // LoopFileRequest{file} -> LoopFindResponse
	// HostCallLoopResize makes a device pick up its file's new size.
	HostCallLoopResize = "loop_resize" // LoopDeviceRequest{device} -> LoopResizeResponse.SizeBytes
	// HostCallLoopDetach detaches a device; a free one is success.
	HostCallLoopDetach = "loop_detach" // LoopDeviceRequest{device} -> Empty
)

// LoopAttachRequest attaches File to a free loop device, or answers the
// device it is already attached to (FAILED_PRECONDITION when that device
// has the other read-only mode). NOT_FOUND for a missing file,
// INVALID_ARGUMENT for one that is not a regular file, RESOURCE_EXHAUSTED
// when the kernel has no loop device left.
type LoopAttachRequest struct {
	File     string `wire:"1"` // absolute path inside a granted root
	ReadOnly bool   `wire:"2"`
	// DirectIO asks the device to bypass the page cache of the backing
	// file; it is dropped, not refused, where the filesystem cannot.
	DirectIO bool `wire:"3"`
}

// LoopDevice is an attached loop device.
type LoopDevice struct {
	Path string `wire:"1"` // "/dev/loopN"
	// File is the backing file's path as the kernel shows it now (it
	// follows renames); Deleted says the file has no name any more.
	File      string `wire:"2"`
	Deleted   bool   `wire:"3"`
	SizeBytes int64  `wire:"4"`
	ReadOnly  bool   `wire:"5"`
	DirectIO  bool   `wire:"6"` // the kernel granted direct I/O
}

// LoopFileRequest names a file inside a granted root.
type LoopFileRequest struct {
	File string `wire:"1"`
}

// LoopFindResponse answers the device File is attached to, matched by the
// file's identity (device and inode), not its name.
type LoopFindResponse struct {
	Found  bool       `wire:"1"`
	Device LoopDevice `wire:"2"`
}

// LoopDeviceRequest names a loop device, "/dev/loopN".
//
//   - loop_resize: the device picks up its backing file's current size
//     (after file_resize); NOT_FOUND when it is not attached.
//   - loop_detach: a free device is success; FAILED_PRECONDITION while the
//     device is mounted or otherwise held.
type LoopDeviceRequest struct {
	Device string `wire:"1"`
}

// LoopResizeResponse answers the device's new size.
type LoopResizeResponse struct {
	SizeBytes int64 `wire:"1"`
}
