// Command testregistry serves a real OCI distribution registry (the CNCF
// distribution project's own server) on a local address, storing in a
// folder: the registry the signed-module tests pull from. It is a module of
// its own so the daemon's go.mod never carries the registry.
//
//	testregistry -addr 127.0.0.1:5000 -dir /tmp/registry
//
// It prints "ready" on stdout once it accepts connections and stops on
// SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:5000", "address to serve on")
	dir := flag.String("dir", "", "storage folder")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "testregistry: -dir is required")
		os.Exit(2)
	}
	cfg := &configuration.Configuration{}
	cfg.HTTP.Addr = *addr
	cfg.Log.Level = "error"
	cfg.Log.AccessLog.Disabled = true
	cfg.Storage = configuration.Storage{
		"filesystem": configuration.Parameters{"rootdirectory": *dir},
		"delete":     configuration.Parameters{"enabled": true},
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	reg, err := registry.NewRegistry(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testregistry:", err)
		os.Exit(1)
	}
	errc := make(chan error, 1)
	go func() { errc <- reg.ListenAndServe() }()
	for i := 0; ; i++ {
		c, err := net.Dial("tcp", *addr)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-errc:
			fmt.Fprintln(os.Stderr, "testregistry:", err)
			os.Exit(1)
		case <-time.After(20 * time.Millisecond):
		}
	}
	fmt.Println("ready")
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = reg.Shutdown(sctx)
	case err := <-errc:
		fmt.Fprintln(os.Stderr, "testregistry:", err)
		os.Exit(1)
	}
}
