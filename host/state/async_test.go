package state

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/wasmcsi/wasmcsi/abi"
)

// The Async writes are visible at once, durable once wait returns, and
// refused at once when they would be refused synchronously.
func TestAsyncNodeWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openQuiet(t, path)
	waitStage, err := s.PutStageAsync(Stage{VolumeID: "v", StagingPath: "/stage/v"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetStage("v"); err != nil || got.StagingPath != "/stage/v" {
		t.Fatalf("stage before wait = %+v, %v; want it visible at once", got, err)
	}
	waitPub, err := s.PutPublishAsync(Publish{VolumeID: "v", TargetPath: "/target/a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := waitStage(); err != nil {
		t.Fatal(err)
	}
	if err := waitPub(); err != nil {
		t.Fatal(err)
	}
	if err := s.DeletePublishSoon("v", "/target/missing"); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("DeletePublishSoon of a missing record = %v, want NOT_FOUND at once", err)
	}
	if _, err := s.PutPublishAsync(Publish{VolumeID: "v"}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Fatalf("PutPublishAsync without a target = %v, want INVALID_ARGUMENT", err)
	}
	if err := s.DeletePublishSoon("v", "/target/a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetPublish("v", "/target/a"); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("publish after DeletePublishSoon = %v, want NOT_FOUND at once", err)
	}
	if err := s.DeleteStageSoon("missing"); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("DeleteStageSoon of a missing record = %v, want NOT_FOUND at once", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.GetStage("v"); err != nil {
		t.Fatalf("stage after reopen: %v", err)
	}
	if pubs, err := s.PublishesOf("v"); err != nil || len(pubs) != 0 {
		t.Fatalf("publishes after reopen = %+v, %v; want none", pubs, err)
	}
	if err := s.DeleteStageSoon("v"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetStage("v"); abi.CodeOf(err) != abi.NotFound {
		t.Fatalf("stage after DeleteStageSoon = %v, want NOT_FOUND at once", err)
	}
}

// An Async deletion starts no sync of its own; the next waited write's sync
// makes it durable.
func TestAsyncDeletionRidesOnTheNextSync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openQuiet(t, path)
	if err := s.PutStage(Stage{VolumeID: "a", StagingPath: "/stage/a"}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteStageSoon("a"); err != nil {
		t.Fatal(err)
	}
	seq := s.log.lastSeq()
	time.Sleep(50 * time.Millisecond)
	s.log.mu.Lock()
	durable := s.log.durable
	s.log.mu.Unlock()
	if durable >= seq {
		t.Fatal("an Async deletion started a sync of its own")
	}
	if err := s.PutStage(Stage{VolumeID: "b", StagingPath: "/stage/b"}); err != nil {
		t.Fatal(err)
	}
	s.log.mu.Lock()
	durable = s.log.durable
	s.log.mu.Unlock()
	if durable < seq {
		t.Fatal("the next waited write did not make the Async deletion durable")
	}
}

// A write whose log write fails reports it through wait.
func TestAsyncWaitReportsLogFailure(t *testing.T) {
	s := openQuiet(t, filepath.Join(t.TempDir(), "state.db"))
	s.log.mu.Lock()
	s.log.segs[len(s.log.segs)-1].f.Close()
	s.log.mu.Unlock()
	wait, err := s.PutStageAsync(Stage{VolumeID: "v", StagingPath: "/stage/v"})
	if err == nil {
		err = wait()
	}
	wantCode(t, err, abi.Internal, nil)
}

// An async write reaches the disk without anyone waiting for it: the sync
// runs while the caller works.
func TestAsyncSyncStartsAtOnce(t *testing.T) {
	s := openQuiet(t, filepath.Join(t.TempDir(), "state.db"))
	wait, err := s.PutStageAsync(Stage{VolumeID: "v", StagingPath: "/stage/v"})
	if err != nil {
		t.Fatal(err)
	}
	seq := s.log.lastSeq()
	deadline := time.Now().Add(2 * time.Second)
	for {
		s.log.mu.Lock()
		durable := s.log.durable
		s.log.mu.Unlock()
		if durable >= seq {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the async write was not synced until someone waited for it")
		}
		time.Sleep(time.Millisecond)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if err := wait(); err != nil {
		t.Fatalf("a second wait: %v", err)
	}
}

// Sync makes a Soon write durable, and costs nothing when the log has
// nothing unsynced.
func TestSyncMakesSoonWritesDurable(t *testing.T) {
	s := openQuiet(t, filepath.Join(t.TempDir(), "state.db"))
	durable := func() uint64 {
		s.log.mu.Lock()
		defer s.log.mu.Unlock()
		return s.log.durable
	}
	if err := s.Sync(); err != nil {
		t.Fatalf("Sync of an empty log: %v", err)
	}
	if err := s.InsertVolumeSoon(Volume{ID: "v", Name: "n"}); err != nil {
		t.Fatal(err)
	}
	seq := s.log.lastSeq()
	if durable() >= seq {
		t.Fatal("a Soon write was synced at once")
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if durable() < seq {
		t.Fatal("Sync returned before the Soon write was durable")
	}
	if err := s.Sync(); err != nil {
		t.Fatalf("Sync with nothing unsynced: %v", err)
	}
}

// TestWrittenBeforeSynced: Written returns once an Async record is in the
// log file, while its sync is still under way, so a caller can change the
// system (a mount) beside the sync and a killed daemon still finds the
// record that explains the change.
func TestWrittenBeforeSynced(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s := openQuiet(t, path)
	release := make(chan struct{})
	syncing := make(chan struct{}, 1)
	old := fdatasync
	fdatasync = func(fd int) error {
		select {
		case syncing <- struct{}{}:
		default:
		}
		<-release
		return old(fd)
	}
	defer func() { fdatasync = old }()
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	wait, err := s.PutStageAsync(Stage{VolumeID: "vol-written", StagingPath: "/stage/vol-written"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Written() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Written waits for the sync")
	}
	segs, err := filepath.Glob(filepath.Join(filepath.Dir(path), "*"))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range segs {
		if b, err := os.ReadFile(f); err == nil && bytes.Contains(b, []byte("vol-written")) {
			found = true
		}
	}
	if !found {
		t.Fatalf("after Written no file among %v holds the record", segs)
	}
	select {
	case <-syncing:
	default:
		t.Fatal("the record's sync never started")
	}
	close(release)
	released = true
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
