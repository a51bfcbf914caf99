// Package catalog is the list of every host call the daemon offers to
// modules. Adding a family to the daemon means adding its Bindings here
// (and, for a family that makes block devices, its DeviceOwner to
// DeviceOwners); nothing else in the host names host calls.
package catalog

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/dirpool"
	"github.com/wasmcsi/wasmcsi/hostcalls/dm"
	"github.com/wasmcsi/wasmcsi/hostcalls/filepool"
	"github.com/wasmcsi/wasmcsi/hostcalls/iscsi"
	"github.com/wasmcsi/wasmcsi/hostcalls/lio"
	"github.com/wasmcsi/wasmcsi/hostcalls/loop"
	"github.com/wasmcsi/wasmcsi/hostcalls/lvm"
	"github.com/wasmcsi/wasmcsi/hostcalls/mount"
	"github.com/wasmcsi/wasmcsi/hostcalls/netinfo"
	"github.com/wasmcsi/wasmcsi/hostcalls/nfs"
	"github.com/wasmcsi/wasmcsi/hostcalls/nfsd"
	"github.com/wasmcsi/wasmcsi/hostcalls/nvme"
	"github.com/wasmcsi/wasmcsi/hostcalls/nvmet"
)

// Options configure the families that keep state of their own.
type Options struct {
	// StateDir is the daemon's state folder; the iSCSI initiator keeps
	// which volumes use which session under StateDir/iscsi. Empty leaves
	// the iscsi family out.
	StateDir string
	// Exports is the nfsd family's server; nil is the system's
	// (/etc/exports.d, exportfs).
	Exports *nfsd.Server
}

// reapplyExports makes the kernel serve the recorded exports when there
// are any and this host has an NFS server; a failure is logged, not
// fatal: the records stay and every later change applies them again.
func reapplyExports(s *nfsd.Server) {
	if nfsd.Available() != nil {
		return
	}
	files, _ := filepath.Glob(filepath.Join(s.Dir, nfsd.FilePrefix+"*.exports"))
	if len(files) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Apply(ctx); err != nil {
		slog.Warn("nfs exports not re-applied at start-up", "error", err)
	}
}

// New returns every host call by import name.
func New(o Options) (map[string]hostcalls.Func, error) {
	families := [][]hostcalls.Func{
		dirpool.Bindings(),
		mount.Bindings(),
		filepool.Bindings(),
		loop.Bindings(),
		dm.Bindings(),
		lio.Bindings(),
		lvm.Bindings(),
		netinfo.Bindings(),
		nvmet.Bindings(),
		// The NVMe initiator keeps no state of its own: the kernel's
		// controllers are its record.
		nvme.Bindings(nvme.New(nvme.Config{})),
		nfs.Bindings(),
	}
	exports := o.Exports
	if exports == nil {
		exports = nfsd.New()
	}
	families = append(families, nfsd.Bindings(exports))
	if o.StateDir != "" {
		// The daemon starts: the kernel serves exactly what the export
		// records say, whatever happened while no daemon ran.
		reapplyExports(exports)
		in, err := iscsi.New(filepath.Join(o.StateDir, "iscsi"), nil)
		if err != nil {
			return nil, err
		}
		families = append(families, iscsi.Bindings(in))
	}
	out := map[string]hostcalls.Func{}
	for _, family := range families {
		for _, f := range family {
			if _, dup := out[f.Name]; dup {
				return nil, fmt.Errorf("catalog: host call %q declared twice", f.Name)
			}
			out[f.Name] = f
		}
	}
	return out, nil
}

// DeviceOwners returns every family that makes block devices, each of
// which answers whether a device a module names is its own (see
// hostcalls.DeviceOwner); the host stages only a device one of them
// claims. A family that makes devices is added here too.
func DeviceOwners() []hostcalls.DeviceOwner {
	return []hostcalls.DeviceOwner{loop.Devices, dm.Devices, iscsi.Devices, lvm.Devices, nvme.Devices}
}

// DefersSyncs reports whether family's durable effects are the entries of
// its pool folders themselves, or nothing, so that a backend granted only
// such families may leave its pool folder syncs to the caller's batch
// (hostcalls.DirSyncs; host/RATIONALE.md, "Records"). A family that keeps
// state elsewhere (device-mapper, an iSCSI target) is not listed: modules
// granted it may record in pool files what they chose there, which a power
// loss must not take while the state they describe stays. A new family is
// listed here only when that holds for it.
func DefersSyncs(family string) bool {
	switch family {
	case dirpool.Family, filepool.Family, loop.Family, mount.Family, netinfo.Family:
		return true
	}
	return false
}

// All returns every stateless host call (all but the iscsi family), for
// tests and tools that run modules outside the daemon.
func All() map[string]hostcalls.Func {
	m, err := New(Options{})
	if err != nil {
		panic(err) // a duplicate name: a programming error the package test catches
	}
	return m
}
