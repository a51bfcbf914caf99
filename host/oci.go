package host

import (
	"context"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"time"

	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/modules/oci"
)

// newPuller returns the puller of the modules whose source is an OCI
// reference, or nil when there is none. It reads the public keys and takes
// up the cache (state folder, "oci"); it reaches no registry.
func newPuller(cfg *config.Config, opt Options, log *slog.Logger) (*oci.Puller, error) {
	var srcs []oci.Source
	for _, name := range slices.Sorted(maps.Keys(cfg.Modules)) {
		m := cfg.Modules[name]
		if m.Source == "" || m.Disabled {
			continue
		}
		path := m.Key
		if path == "" {
			path = cfg.OCI.Key
		}
		key, err := oci.ReadPublicKey(path)
		if err != nil {
			return nil, err
		}
		srcs = append(srcs, oci.Source{Name: name, Ref: m.Source, Key: key, Grant: m.HostCalls, Pin: m.SHA256})
	}
	if len(srcs) == 0 {
		return nil, nil
	}
	return oci.New(oci.Options{
		Dir:       filepath.Join(cfg.StateDir, "oci"),
		Sources:   srcs,
		PlainHTTP: cfg.OCI.PlainHTTP,
		AuthFile:  cfg.OCI.AuthFile,
		Log:       log,
		Metrics:   opt.Metrics,
	})
}

// WatchRegistries resolves the OCI modules' tags every interval and
// reloads the modules when one moved, until ctx ends. It returns at once
// when no module comes from a registry.
func (s *Server) WatchRegistries(ctx context.Context, interval time.Duration) {
	if s.oci == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s.oci.Sync(ctx, false) {
				s.log.Info("a module's registry tag moved: reloading modules")
				s.reloadModules(ctx)
			}
		}
	}
}
