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

// crashEnv names the state file a re-executed test binary writes to until it
// is killed; see TestCrashRecovery.
const crashEnv = "WASMCSI_STATE_CRASH_WRITER"

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
	s, err := Open(path)
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

// TestCrashRecovery kills a writer process with SIGKILL in the middle of its
// writes and checks that the file opens, passes bbolt's consistency check,
// holds every put that was acknowledged and none of the acknowledged
// deletes, and that the name index agrees with the records.
//
// A process crash loses the process's memory but not the kernel's page
// cache, so this does not exercise power loss; that rests on bbolt's commit
// order (data pages, fdatasync, then meta page, fdatasync) with NoSync
// false, which this package never changes.
func TestCrashRecovery(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashEnv+"="+path)
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
	// tried holds deletes that were issued: one the kill cut off between
	// its commit and its acknowledgement may or may not have happened.
	put, deleted, tried := map[string]bool{}, map[string]bool{}, map[string]bool{}
	record := func(line string) {
		verb, id, _ := strings.Cut(line, " ")
		switch verb {
		case "put":
			put[id] = true
		case "del":
			deleted[id] = true
		case "try":
			tried[id] = true
		}
	}
	lines := bufio.NewScanner(stdout)
	deadline := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	for len(put)+len(deleted) < want && lines.Scan() {
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
	if len(put) == 0 {
		t.Fatalf("writer acknowledged nothing; stderr: %s", stderr.String())
	}
	if len(put)+len(deleted) < want {
		t.Fatalf("writer stopped after %d acknowledgements; stderr: %s", len(put)+len(deleted), stderr.String())
	}

	s, err := Open(path)
	if err != nil {
		t.Fatalf("open after crash: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	checkDB(t, s)
	for id := range put {
		_, err := s.GetVolume(id)
		switch {
		case deleted[id] && !errors.Is(err, ErrNotFound):
			t.Errorf("acknowledged delete of %s lost: %v", id, err)
		case !deleted[id] && !tried[id] && err != nil:
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
	t.Logf("killed after %d puts and %d deletes acknowledged; %d volumes on reopen", len(put), len(deleted), len(vols))
}
