package dm

import (
	"context"
	"os"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wasmcsi/wasmcsi/abi"
)

func TestParseTable(t *testing.T) {
	for _, c := range []struct {
		name string
		text string
		want []Target
		code abi.Code
	}{
		{"one", "0 2048 linear 7:0 0\n", []Target{{0, 2048, "linear", "7:0 0"}}, abi.OK},
		{"two with comment", "# pool\n0 10 zero\n\n10 5 thin 253:0 1", []Target{{0, 10, "zero", ""}, {10, 5, "thin", "253:0 1"}}, abi.OK},
		{"empty", "\n# nothing\n", nil, abi.InvalidArgument},
		{"gap", "0 10 zero\n11 5 zero", nil, abi.InvalidArgument},
		{"overlap", "0 10 zero\n5 5 zero", nil, abi.InvalidArgument},
		{"zero length", "0 0 zero", nil, abi.InvalidArgument},
		{"not a number", "0 x zero", nil, abi.InvalidArgument},
		{"short line", "0 10", nil, abi.InvalidArgument},
		{"long type", "0 10 averyveryverylongtype", nil, abi.InvalidArgument},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseTable(c.text)
			if code := abi.CodeOf(err); code != c.code {
				t.Fatalf("code %v (%v), want %v", code, err, c.code)
			}
			if c.code == abi.OK && !reflect.DeepEqual(got, c.want) {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
}

func TestTargetStringRoundTrip(t *testing.T) {
	table := []Target{{0, 2048, "linear", "7:0 0"}, {2048, 8, "zero", ""}}
	var lines []string
	for _, tg := range table {
		lines = append(lines, tg.String())
	}
	if lines[0] != "0 2048 linear 7:0 0" || lines[1] != "2048 8 zero" {
		t.Errorf("lines %q", lines)
	}
	back, err := ParseTable(strings.Join(lines, "\n"))
	if err != nil || !reflect.DeepEqual(back, table) {
		t.Errorf("round trip %v, %v", back, err)
	}
	if Size(table) != 2056 || Size(nil) != 0 {
		t.Errorf("Size %d", Size(table))
	}
}

func TestParamsWithNewlineRefused(t *testing.T) {
	if err := validTable([]Target{{0, 1, "linear", "7:0 0\n1 1 zero"}}); abi.CodeOf(err) != abi.InvalidArgument {
		t.Errorf("err %v", err)
	}
}

func TestConfine(t *testing.T) {
	grants := []string{"wasmcsi-lvm-", "wasmcsi-thin."}
	for _, c := range []struct {
		name string
		code abi.Code
	}{
		{"wasmcsi-lvm-pool", abi.OK},
		{"wasmcsi-thin.pool-12", abi.OK},
		{"wasmcsi-lvm-", abi.OK},
		{"wasmcsi-other", abi.PermissionDenied},
		{"vg0-root", abi.PermissionDenied},
		{"control", abi.PermissionDenied},
		{"wasmcsi-lvm-../x", abi.InvalidArgument},
		{"wasmcsi-lvm- x", abi.InvalidArgument},
		{"wasmcsi-lvm-\x00", abi.InvalidArgument},
		{"", abi.InvalidArgument},
		{"..", abi.InvalidArgument},
		{"wasmcsi-lvm-" + strings.Repeat("a", 120), abi.InvalidArgument},
	} {
		if code := abi.CodeOf(Confine(grants, c.name)); code != c.code {
			t.Errorf("Confine(%q) = %v, want %v", c.name, code, c.code)
		}
	}
	if abi.CodeOf(Confine([]string{""}, "anything")) != abi.PermissionDenied {
		t.Error("an empty prefix granted everything")
	}
}

func TestNew(t *testing.T) {
	if _, err := New(); abi.CodeOf(err) != abi.InvalidArgument {
		t.Errorf("New() = %v", err)
	}
	if _, err := New("a/b"); abi.CodeOf(err) != abi.InvalidArgument {
		t.Errorf("New(a/b) = %v", err)
	}
	m, err := New("wasmcsi-")
	if err != nil {
		t.Fatal(err)
	}
	if m.Path("wasmcsi-x") != "/dev/mapper/wasmcsi-x" {
		t.Errorf("path %s", m.Path("wasmcsi-x"))
	}
	// Every entry point refuses names outside the grant before any syscall.
	ctx := context.Background()
	checks := map[string]error{}
	_, checks["create"] = m.Create(ctx, "other", []Target{{0, 1, "zero", ""}})
	checks["reload"] = m.Reload(ctx, "other", []Target{{0, 1, "zero", ""}})
	checks["suspend"] = m.Suspend(ctx, "other")
	checks["resume"] = m.Resume(ctx, "other")
	checks["remove"] = m.Remove(ctx, "other")
	_, checks["info"] = m.Info(ctx, "other")
	_, checks["status"] = m.Status(ctx, "other")
	_, checks["table"] = m.Table(ctx, "other")
	_, checks["message"] = m.Message(ctx, "other", 0, "x")
	_, checks["create pool"] = m.CreatePool(ctx, Pool{Name: "other", BlockSectors: 128})
	_, checks["open pool"] = m.OpenPool(ctx, Pool{Name: "other"})
	for op, err := range checks {
		if abi.CodeOf(err) != abi.PermissionDenied {
			t.Errorf("%s of a foreign name: %v", op, err)
		}
	}
}

func TestMessageValidation(t *testing.T) {
	m, _ := New("wasmcsi-")
	for _, msg := range []string{"", "a\nb", strings.Repeat("x", 5000), "caf\xc3\xa9"} {
		if _, err := m.Message(context.Background(), "wasmcsi-p", 0, msg); abi.CodeOf(err) != abi.InvalidArgument {
			t.Errorf("message %q: %v", msg, err)
		}
	}
}

func TestErrnoCodes(t *testing.T) {
	for e, want := range map[unix.Errno]abi.Code{
		unix.ENXIO: abi.NotFound, unix.ENODATA: abi.NotFound, unix.EEXIST: abi.AlreadyExists,
		unix.EBUSY: abi.FailedPrecondition, unix.EINVAL: abi.InvalidArgument, unix.ENOSPC: abi.ResourceExhausted,
		unix.EPERM: abi.PermissionDenied, unix.EIO: abi.Internal,
	} {
		err := wrapErr("op", "wasmcsi-x", e)
		if abi.CodeOf(err) != want || !strings.Contains(err.Error(), "dm op wasmcsi-x: ") {
			t.Errorf("%v -> %v", e, err)
		}
	}
	if abi.CodeOf(wrapErr("op", "", context.Canceled)) != abi.Canceled {
		t.Error("context.Canceled lost its code")
	}
}

// Where the kernel has no device-mapper, commands say so instead of failing
// obscurely.
func TestNoDeviceMapper(t *testing.T) {
	if _, err := os.Stat("/sys/class/misc/device-mapper"); err == nil {
		t.Skip("this kernel has device-mapper; dm_vm_test.go covers it")
	}
	m, _ := New("wasmcsi-")
	_, err := m.Version(context.Background())
	if abi.CodeOf(err) != abi.FailedPrecondition || !strings.Contains(err.Error(), "not available") {
		t.Errorf("Version without device-mapper: %v", err)
	}
}

func TestCanceledContext(t *testing.T) {
	m, _ := New("wasmcsi-")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Info(ctx, "wasmcsi-x"); abi.CodeOf(err) != abi.Canceled {
		t.Errorf("Info with a canceled context: %v", err)
	}
}
