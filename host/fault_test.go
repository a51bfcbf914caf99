package host_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmcsi/wasmcsi/host/config"
)

// faultTimeout is the fault module's call deadline; localdir keeps the
// daemon-wide default, so only the fault module's calls are cut short.
const faultTimeout = 300 * time.Millisecond

// TestFaultyBackendIsolated loads localdir beside a backend whose
// create_volume traps, loops forever or floods its memory. Each fault fails
// only its own call, with INTERNAL or DEADLINE_EXCEEDED within the module's
// deadline, while CreateVolume/DeleteVolume on localdir keep succeeding
// concurrently, and the daemon (the faulty backend included, on fresh
// instances) keeps serving after each fault.
func TestFaultyBackendIsolated(t *testing.T) {
	g := newGate()
	o := localdirOptions(t)
	// A small memory cap keeps the flood (a page at a time) short.
	o.more = []daemonModule{faultModule(&config.Limits{CallTimeout: faultTimeout, MemoryPages: 64})}
	o.hostCalls = append(o.hostCalls, g.hostCall())
	d := startDaemon(t, o)

	// localdir traffic for the whole test.
	var ok, failed atomic.Int64
	var errMu sync.Mutex
	var firstErr error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := createThenDelete(ctx, d, fmt.Sprintf("busy-%d-%d", w, i))
				cancel()
				if err != nil {
					if failed.Add(1) == 1 {
						errMu.Lock()
						firstErr = err
						errMu.Unlock()
					}
					continue
				}
				ok.Add(1)
			}
		}()
	}
	t.Cleanup(func() { close(stop); wg.Wait() })

	fault := map[string]string{backendParam: "fault"}
	cases := []struct {
		name  string // its first letter picks the fault
		code  codes.Code
		words []string
		// min is how long the call must at least take (a deadline fault
		// cannot end before the deadline).
		min time.Duration
	}{
		{name: "trap-1", code: codes.Internal, words: []string{"fault", "trap on purpose"}},
		{name: "loop-1", code: codes.DeadlineExceeded, words: []string{"fault"}, min: faultTimeout},
		{name: "flood-1", code: codes.Internal, words: []string{"fault"}},
		{name: "trap-2", code: codes.Internal, words: []string{"trap on purpose"}},
		{name: "loop-2", code: codes.DeadlineExceeded, min: faultTimeout},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := ok.Load()
			start := time.Now()
			_, err := d.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{Name: c.name, Parameters: fault, VolumeCapabilities: rwCaps()})
			took := time.Since(start)
			wantCode(t, err, c.code, c.words...)
			if took < c.min || took > faultTimeout+2*time.Second {
				t.Errorf("%s failed after %v; the module's deadline is %v", c.name, took, faultTimeout)
			}
			// The faulty backend serves again, on a fresh instance.
			good := fmt.Sprintf("good-%d", i)
			made, err := d.controller().CreateVolume(callCtx(t), &csi.CreateVolumeRequest{Name: good, Parameters: fault, VolumeCapabilities: rwCaps()})
			if err != nil {
				t.Fatalf("fault backend after %s: %v", c.name, err)
			}
			if _, err := d.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: made.GetVolume().GetVolumeId()}); err != nil {
				t.Fatal(err)
			}
			// And localdir made progress meanwhile.
			deadline := time.Now().Add(10 * time.Second)
			for ok.Load() == before && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if ok.Load() == before {
				t.Fatalf("no localdir CreateVolume/DeleteVolume succeeded during and after %s", c.name)
			}
		})
	}
	close(stop)
	wg.Wait()
	stop = make(chan struct{}) // for the cleanup's close
	if n := failed.Load(); n > 0 {
		errMu.Lock()
		t.Errorf("%d localdir calls failed beside the faults; first: %v", n, firstErr)
		errMu.Unlock()
	}
	t.Logf("localdir create+delete pairs during the faults: %d", ok.Load())
	if _, err := d.identity().Probe(callCtx(t), &csi.ProbeRequest{}); err != nil {
		t.Errorf("probe after the faults: %v", err)
	}
}

// createThenDelete creates a localdir volume and deletes it.
func createThenDelete(ctx context.Context, d *daemon, name string) error {
	resp, err := d.controller().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: rwCaps()})
	if err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	if _, err := d.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()}); err != nil {
		return fmt.Errorf("delete %s: %v", name, status.Convert(err).Message())
	}
	return nil
}
