package loop

import (
	"context"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// Detach forgets the hint of the file it unbinds, so a long-running daemon
// does not keep one for every file it ever attached.
func TestDetachDropsHint(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	if _, err := os.Stat(controlPath); err != nil {
		t.Skipf("no loop devices here: %v", err)
	}
	ctx := context.Background()
	file := t.TempDir() + "/backing"
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, 4<<20); err != nil {
		t.Fatal(err)
	}
	d, err := Attach(ctx, file, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		t.Fatal(err)
	}
	id := fileID{dev: st.Dev, ino: st.Ino}
	if v, ok := hints.Load(id); !ok || v != d.Path {
		t.Fatalf("hint after attach = %v, %v; want %s", v, ok, d.Path)
	}
	if err := Detach(ctx, d.Path); err != nil {
		t.Fatal(err)
	}
	if v, ok := hints.Load(id); ok {
		t.Fatalf("hint after detach = %v; want none", v)
	}
}
