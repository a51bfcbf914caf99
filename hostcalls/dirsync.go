package hostcalls

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"syscall"
)

// DirSyncs collects the folders whose entries host calls changed (a
// volume folder made or removed, a volume file linked or unlinked) without
// syncing them, for a caller that syncs them itself, in a batch, before
// it relies on the changes surviving a power loss (host/RATIONALE.md,
// "Records": the controller logs an intent first). A call run without one
// in its context syncs the folder itself before it returns.
type DirSyncs struct {
	mu   sync.Mutex
	dirs map[string]struct{}
}

type dirSyncsKey struct{}

// WithDirSyncs returns ctx whose host calls leave their folder syncs to d.
func WithDirSyncs(ctx context.Context, d *DirSyncs) context.Context {
	return context.WithValue(ctx, dirSyncsKey{}, d)
}

// Dirs returns the folders collected so far, sorted.
func (d *DirSyncs) Dirs() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.dirs))
	for dir := range d.dirs {
		out = append(out, dir)
	}
	slices.Sort(out)
	return out
}

// SyncDir makes a change to the entries of the folder fd (whose path is
// path) durable: now, with fsync (syscall's, which also builds for the
// wasip1 vet of sdk/moduletest, an importer of this package), or, when ctx carries DirSyncs, by
// recording path for its owner to sync.
func SyncDir(ctx context.Context, fd int, path string) error {
	if d, ok := ctx.Value(dirSyncsKey{}).(*DirSyncs); ok && d != nil {
		d.mu.Lock()
		if d.dirs == nil {
			d.dirs = make(map[string]struct{})
		}
		d.dirs[path] = struct{}{}
		d.mu.Unlock()
		return nil
	}
	if err := syscall.Fsync(fd); err != nil {
		return fmt.Errorf("sync folder %s: %w", path, err)
	}
	return nil
}

// Deferred reports whether ctx carries DirSyncs: a call that found its
// work already done (an idempotent repeat) records its folder then too,
// since the earlier call may have left the sync to someone who has not
// done it yet.
func Deferred(ctx context.Context) bool {
	d, ok := ctx.Value(dirSyncsKey{}).(*DirSyncs)
	return ok && d != nil
}
