package state

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// crashEnv names the state file a re-executed test binary writes to
	// until it is killed; see TestCrashRecovery.
	crashEnv = "WASMCSI_STATE_CRASH_WRITER"
	// crashQuietEnv, set, makes that writer open the store with quiet
	// options, so that nothing is checkpointed before the kill.
	crashQuietEnv = "WASMCSI_STATE_CRASH_QUIET"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(crashEnv); path != "" {
		crashWriter(path)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// crashWriter puts and deletes volumes from four goroutines forever and
// prints "put ID" or "del ID" on stdout after each call returns, and "try ID"
// before each delete. The parent kills it mid-stream.
func crashWriter(path string) {
	opts := defaultOptions()
	if os.Getenv(crashQuietEnv) != "" {
		opts = quietOptions()
	}
	s, err := open(path, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var out sync.Mutex
	ack := func(verb, id string) {
		out.Lock()
		fmt.Fprintf(os.Stdout, "%s %s\n", verb, id) // unbuffered: one write per line
		out.Unlock()
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				id := fmt.Sprintf("w%d-%06d", w, i)
				if err := s.PutVolume(Volume{ID: id, Name: "name-" + id, CapacityBytes: int64(i)}); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(2)
				}
				ack("put", id)
				if i%3 == 2 {
					old := fmt.Sprintf("w%d-%06d", w, i-1)
					ack("try", old)
					if err := s.DeleteVolume(old); err != nil {
						fmt.Fprintln(os.Stderr, err)
						os.Exit(2)
					}
					ack("del", old)
				}
			}
		}()
	}
	wg.Wait()
}

// crashAcks is what a killed crashWriter acknowledged.
type crashAcks struct {
	put, deleted map[string]bool
	// tried holds deletes that were issued: one the kill cut off between
	// its commit and its acknowledgement may or may not have happened.
	tried map[string]bool
}

// killWriter runs crashWriter on path with the extra environment env, kills
// it with SIGKILL after 400 acknowledgements, and returns them all.
func killWriter(t *testing.T, path string, env ...string) crashAcks {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), crashEnv+"="+path), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	const want = 400 // acknowledgements to see before the kill
	acks := crashAcks{put: map[string]bool{}, deleted: map[string]bool{}, tried: map[string]bool{}}
	record := func(line string) {
		verb, id, _ := strings.Cut(line, " ")
		switch verb {
		case "put":
			acks.put[id] = true
		case "del":
			acks.deleted[id] = true
		case "try":
			acks.tried[id] = true
		}
	}
	lines := bufio.NewScanner(stdout)
	deadline := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	for len(acks.put)+len(acks.deleted) < want && lines.Scan() {
		record(lines.Text())
	}
	deadline.Stop()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Every acknowledgement the writer printed before it died counts, also
	// those still in the pipe: a delete acknowledged after the 400th line
	// legitimately removed a put this test already saw.
	for lines.Scan() {
		record(lines.Text())
	}
	cmd.Wait()
	if len(acks.put) == 0 {
		t.Fatalf("writer acknowledged nothing; stderr: %s", stderr.String())
	}
	if len(acks.put)+len(acks.deleted) < want {
		t.Fatalf("writer stopped after %d acknowledgements; stderr: %s", len(acks.put)+len(acks.deleted), stderr.String())
	}
	return acks
}

// checkAcks checks that s, opened after the kill, passes bbolt's
// consistency check, holds every put that was acknowledged and none of the
// acknowledged deletes, and that the name index agrees with the records.
func checkAcks(t *testing.T, s *Store, acks crashAcks) {
	t.Helper()
	checkDB(t, s)
	for id := range acks.put {
		_, err := s.GetVolume(id)
		switch {
		case acks.deleted[id] && !errors.Is(err, ErrNotFound):
			t.Errorf("acknowledged delete of %s lost: %v", id, err)
		case !acks.deleted[id] && !acks.tried[id] && err != nil:
			t.Errorf("acknowledged put of %s lost: %v", id, err)
		}
	}
	vols, _, err := s.ListVolumes("", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		if got, err := s.VolumeByName(v.Name); err != nil || got.ID != v.ID {
			t.Errorf("name index for %s: %q, %v", v.ID, got.ID, err)
		}
	}
	t.Logf("killed after %d puts and %d deletes acknowledged; %d volumes on reopen", len(acks.put), len(acks.deleted), len(vols))
}

// TestCrashRecovery kills a writer process with SIGKILL in the middle of its
// writes and checks that the file opens with every acknowledged write, as
// checkAcks says.
//
// A process crash loses the process's memory but not the kernel's page
// cache, so this does not exercise power loss; that rests on the order of
// writes: a call returns only after fdatasync of its log record, a segment
// is whole on disk before the next one takes records, a checkpoint commits
// to bbolt (data pages, fdatasync, then meta page, fdatasync, NoSync false)
// before the log it covers is removed.
func TestCrashRecovery(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	acks := killWriter(t, path)
	s, err := Open(path)
	if err != nil {
		t.Fatalf("open after crash: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	checkAcks(t, s, acks)
}
