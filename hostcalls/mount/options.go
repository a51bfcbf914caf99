package mount

import (
	"strings"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

// flagOptions are the generic mount options that are mount(2) flags, as
// mount(8) knows them: set is or-ed in, clear is taken out.
var flagOptions = map[string]struct{ set, clear uintptr }{
	"ro":          {set: unix.MS_RDONLY},
	"rw":          {clear: unix.MS_RDONLY},
	"nosuid":      {set: unix.MS_NOSUID},
	"suid":        {clear: unix.MS_NOSUID},
	"nodev":       {set: unix.MS_NODEV},
	"dev":         {clear: unix.MS_NODEV},
	"noexec":      {set: unix.MS_NOEXEC},
	"exec":        {clear: unix.MS_NOEXEC},
	"sync":        {set: unix.MS_SYNCHRONOUS},
	"async":       {clear: unix.MS_SYNCHRONOUS},
	"dirsync":     {set: unix.MS_DIRSYNC},
	"noatime":     {set: unix.MS_NOATIME},
	"atime":       {clear: unix.MS_NOATIME},
	"nodiratime":  {set: unix.MS_NODIRATIME},
	"diratime":    {clear: unix.MS_NODIRATIME},
	"relatime":    {set: unix.MS_RELATIME},
	"norelatime":  {clear: unix.MS_RELATIME},
	"strictatime": {set: unix.MS_STRICTATIME},
	"lazytime":    {set: unix.MS_LAZYTIME},
	"nolazytime":  {clear: unix.MS_LAZYTIME},
	"silent":      {set: unix.MS_SILENT},
	"loud":        {clear: unix.MS_SILENT},
}

// userspaceOptions mean something to mount(8) or fstab only; the kernel
// would reject them as filesystem data.
var userspaceOptions = map[string]bool{
	"defaults": true, "auto": true, "noauto": true, "user": true, "nouser": true,
	"users": true, "owner": true, "group": true, "_netdev": true, "nofail": true,
}

// refusedOptions change what kind of mount call this is; Bind and the
// propagation of the host's mounts are not Mount's business.
var refusedOptions = map[string]bool{
	"bind": true, "rbind": true, "remount": true, "move": true,
	"shared": true, "rshared": true, "slave": true, "rslave": true,
	"private": true, "rprivate": true, "unbindable": true, "runbindable": true,
}

// parseOptions splits mount(8)-style options into mount(2) flags and the
// filesystem's data string. Each element is one option: a comma, a NUL or
// an empty option is InvalidArgument, and so is one that changes the kind of
// mount (bind, remount, propagation).
func parseOptions(options []string) (uintptr, string, error) {
	var flags uintptr
	var data []string
	for _, o := range options {
		switch {
		case o == "" || strings.ContainsAny(o, ",\x00"):
			return 0, "", abi.Errorf(abi.InvalidArgument, "mount: invalid option %q: one option per element", o)
		case refusedOptions[o]:
			return 0, "", abi.Errorf(abi.InvalidArgument, "mount: option %q is not for Mount", o)
		case userspaceOptions[o], strings.HasPrefix(o, "x-"), strings.HasPrefix(o, "comment="):
			continue
		}
		if f, ok := flagOptions[o]; ok {
			flags = flags&^f.clear | f.set
			continue
		}
		data = append(data, o)
	}
	s := strings.Join(data, ",")
	if len(s) >= 4096 { // the kernel copies at most one page of data
		return 0, "", abi.Errorf(abi.InvalidArgument, "mount: %d bytes of filesystem options, the limit is 4095", len(s))
	}
	return flags, s, nil
}
