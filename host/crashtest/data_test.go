package crashtest

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// What a pod writes into a volume: a token naming this generation of the
// data, and fill derived from it, so a reader can tell the whole
// generation from a torn or partial one. On a filesystem the fill is many
// files (a directory copy cut short misses some, or has one short); on a
// block device it is a header block and the fill after it.
const (
	fillFiles   = 8
	fillBytes   = 32 << 10
	headerBytes = 4096
	tokenFile   = "token"
	blockMagic  = "wasmcsi-crash\n"
)

// fill is the i-th fill block of a token's data.
func fill(token string, i int) []byte {
	seed := sha256.Sum256([]byte(token + "/" + strconv.Itoa(i)))
	out := make([]byte, fillBytes)
	rand.NewChaCha8(seed).Read(out)
	return out
}

func fillName(i int) string { return fmt.Sprintf("fill-%02d", i) }

// writeData replaces what a published volume holds with token's data and
// makes it durable, as an application that fsyncs does. block says target
// is a device node instead of a directory.
func writeData(target string, block bool, token string) error {
	if block {
		return writeBlock(target, token)
	}
	for i := range fillFiles {
		if err := writeSynced(filepath.Join(target, fillName(i)), fill(token, i)); err != nil {
			return err
		}
	}
	if err := writeSynced(filepath.Join(target, tokenFile), []byte(token)); err != nil {
		return err
	}
	dir, err := os.Open(target)
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func blockHeader(token string) []byte {
	h := make([]byte, headerBytes)
	copy(h, blockMagic+token+"\n")
	return h
}

func writeBlock(dev, token string) error {
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	for i := range fillFiles {
		if _, err := f.WriteAt(fill(token, i), int64(headerBytes+i*fillBytes)); err != nil {
			return err
		}
	}
	if _, err := f.WriteAt(blockHeader(token), 0); err != nil {
		return err
	}
	return f.Sync()
}

// checkData reports how what target holds differs from token's data ("":
// nothing was ever written: no files, or a zeroed header). nil means it is
// exactly token's data.
func checkData(target string, block bool, token string) error {
	if block {
		return checkBlock(target, token)
	}
	got, err := os.ReadFile(filepath.Join(target, tokenFile))
	switch {
	case token == "" && errors.Is(err, os.ErrNotExist):
		return nil
	case token == "" && err == nil:
		return fmt.Errorf("holds data %q where none was written", got)
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("token file missing (want data %q)", token)
	case err != nil:
		return fmt.Errorf("read token: %w", err)
	case string(got) != token:
		return fmt.Errorf("holds data %q, want %q", got, token)
	}
	for i := range fillFiles {
		b, err := os.ReadFile(filepath.Join(target, fillName(i)))
		if err != nil {
			return fmt.Errorf("data %q: %s: %w", token, fillName(i), err)
		}
		if err := sameFill(b, fill(token, i)); err != nil {
			return fmt.Errorf("data %q: %s: %w", token, fillName(i), err)
		}
	}
	return nil
}

func checkBlock(dev, token string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// Read what the device holds, not what this process's page cache
	// kept of an earlier device of the same number.
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	h := make([]byte, headerBytes)
	if _, err := io.ReadFull(f, h); err != nil {
		return fmt.Errorf("read header: %w", err)
	}
	if token == "" {
		if !bytes.Equal(h, make([]byte, headerBytes)) {
			return fmt.Errorf("holds header %q where none was written", bytes.TrimRight(h[:128], "\x00"))
		}
		return nil
	}
	if !bytes.Equal(h, blockHeader(token)) {
		return fmt.Errorf("holds header %q, want data %q", bytes.TrimRight(h[:128], "\x00"), token)
	}
	for i := range fillFiles {
		b := make([]byte, fillBytes)
		if _, err := f.ReadAt(b, int64(headerBytes+i*fillBytes)); err != nil {
			return fmt.Errorf("data %q: fill block %d: %w", token, i, err)
		}
		if err := sameFill(b, fill(token, i)); err != nil {
			return fmt.Errorf("data %q: fill block %d: %w", token, i, err)
		}
	}
	return nil
}

func sameFill(got, want []byte) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d of %d bytes", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("differs from byte %d on", i)
		}
	}
	return nil
}
