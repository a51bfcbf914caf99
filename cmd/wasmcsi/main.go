// Command wasmcsi is the daemon: it serves the Container Storage Interface
// on a unix socket and runs storage policy in WebAssembly backend modules.
//
//	wasmcsi [serve] [flags]   serve CSI (the default)
//	wasmcsi config            print the embedded default configuration
//	wasmcsi modules [flags]   load every module, print what it offers, exit
//	wasmcsi modules new NAME  write a new module's folder
//	wasmcsi modules call FILE OP [JSON]
//	                          run one operation of a built module
//	wasmcsi modules inspect [--write] FILE
//	                          describe a built module
//	wasmcsi modules push FILE oci://REGISTRY/REPO:TAG --key KEY
//	                          publish a built module, signed
//	wasmcsi modules keygen [PREFIX]
//	                          write a signing key pair
//	wasmcsi version           print the version
//	wasmcsi help              print the commands and flags
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"

	"github.com/wasmcsi/wasmcsi/host"
	"github.com/wasmcsi/wasmcsi/host/config"
	"github.com/wasmcsi/wasmcsi/hostcalls/node/quiesce"
)

func main() {
	// The daemon starts a guardian for every group snapshot that pauses
	// writes by running itself again; this is where such a start ends.
	quiesce.Main()
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "wasmcsi:", err)
		os.Exit(1)
	}
}

// usage is what --help prints before the flags.
const usage = `wasmcsi serves the Container Storage Interface; storage types are
WebAssembly backend modules in its module folder.

Usage:
  wasmcsi [serve] [flags]    serve CSI (the default command)
  wasmcsi modules [flags]    load every module with its grant, print what it offers, exit
  wasmcsi modules new NAME   write the folder NAME: a new backend module, its tests and build
  wasmcsi modules call FILE OP [JSON]
                             run one operation of a built module against a fake host
  wasmcsi modules inspect [--write] FILE
                             print what a built module is and asks for (--write: as a custom section)
  wasmcsi modules push FILE oci://REGISTRY/REPO:TAG --key wasmcsi.key
                             publish a built module to an OCI registry, signed (cosign format)
  wasmcsi modules keygen [PREFIX]
                             write PREFIX.key and PREFIX.pub, a key pair to sign modules with
  wasmcsi config             print the embedded default configuration
  wasmcsi version            print the version
  wasmcsi help               print this help

Flags of serve and modules (they override WASMCSI_* variables, which
override the --config file, which overrides the embedded defaults):
`

func run(args []string, out io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	fs := pflag.NewFlagSet("wasmcsi", pflag.ContinueOnError)
	config.Flags(fs)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, usage)
		fs.PrintDefaults()
	}
	switch cmd {
	case "version":
		fmt.Fprintln(out, host.Version)
		return nil
	case "config":
		_, err := out.Write(config.DefaultYAML())
		return err
	case "help":
		fs.Usage()
		return nil
	case "modules":
		if len(args) > 0 {
			switch args[0] {
			case "new":
				return modulesNew(args[1:], out)
			case "call":
				ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				return modulesCall(ctx, args[1:], out, os.Stderr)
			case "inspect":
				ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				return modulesInspect(ctx, args[1:], out, os.Stderr)
			case "push":
				ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				return modulesPush(ctx, args[1:], out, os.Stderr)
			case "keygen":
				return modulesKeygen(args[1:], out, os.Stderr)
			}
		}
	case "serve":
	default:
		return fmt.Errorf("unknown command %q (serve, modules, config, version, help)", cmd)
	}
	if err := fs.Parse(args); errors.Is(err, pflag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	cfg, err := config.Load(fs, os.Environ())
	if err != nil {
		return err
	}
	log := newLogger(cfg)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cmd == "modules" {
		return listModules(ctx, cfg, log)
	}
	return serve(ctx, cfg, log)
}

func newLogger(cfg *config.Config) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

func serve(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	var reg *prometheus.Registry
	if cfg.MetricsAddress != "" {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	opts := host.Options{Log: log}
	if reg != nil {
		opts.Metrics = reg
	}
	srv, err := host.New(ctx, cfg, opts)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Close(cctx); err != nil {
			log.Error("close", "err", err)
		}
	}()
	// Ephemeral inline volumes a crash left mid-way go before anything is
	// served, and before reconciliation looks for what no record explains.
	srv.Recover(ctx)
	srv.Reconcile(ctx, cfg.Reconcile.Clean)

	if reg != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		hs := &http.Server{Addr: cfg.MetricsAddress, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server", "err", err)
			}
		}()
		defer hs.Close()
	}

	go reloadOnSignal(ctx, srv, log)
	go srv.WatchRegistries(ctx, cfg.OCI.Interval)
	if cfg.WatchModules {
		go watchModules(ctx, cfg.ModuleDir, srv, log)
	}
	log.Info("serving CSI", "endpoint", cfg.Endpoint, "driver", cfg.DriverName, "node", cfg.NodeID,
		"role", cfg.Role, "backends", srv.Backends(), "version", host.Version)
	return srv.Serve(ctx)
}

// reloadOnSignal reloads the modules on SIGHUP.
func reloadOnSignal(ctx context.Context, srv *host.Server, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			log.Info("SIGHUP: reloading modules")
			srv.Reload(ctx)
		}
	}
}

// watchModules reloads the modules when a .wasm file in the folder changes,
// after the folder has been quiet for a moment (a copy is many writes).
func watchModules(ctx context.Context, dir string, srv *host.Server, log *slog.Logger) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		log.Warn("cannot watch module folder; reload with SIGHUP", "err", err)
		return
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		log.Warn("cannot watch module folder; reload with SIGHUP", "dir", dir, "err", err)
		return
	}
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-w.Events:
			if filepath.Ext(ev.Name) == ".wasm" {
				timer = time.After(500 * time.Millisecond)
			}
		case err := <-w.Errors:
			log.Warn("module folder watch", "err", err)
		case <-timer:
			log.Info("module folder changed: reloading modules")
			srv.Reload(ctx)
		}
	}
}

func listModules(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	srv, err := host.New(ctx, cfg, host.Options{Log: log, NoRecords: true})
	if err != nil {
		return err
	}
	defer srv.Close(context.Background())
	for _, d := range srv.Describe() {
		fmt.Println(d)
	}
	return nil
}
