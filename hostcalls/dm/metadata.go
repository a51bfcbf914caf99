package dm

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/wasmcsi/wasmcsi/abi"
)

// Reading a thin pool's mappings. The kernel answers no question about
// which blocks a thin device maps; only its metadata knows. A live pool's
// metadata changes under a reader, so the pool is asked to hold a
// metadata snapshot (the "reserve_metadata_snap" message: a consistent copy
// of the superblock and btree roots, kept until "release_metadata_snap"),
// and thin_dump or thin_delta of thin-provisioning-tools read that
// snapshot from the metadata device while the pool keeps running. No
// library reads this format, so one program runs per question; what it
// prints streams through a decoder and is never held whole.

// BlockRange is a run of a thin device's blocks, in the pool's data blocks
// (BlockSectors each).
type BlockRange struct {
	Begin  uint64
	Length uint64
}

// End returns the block just past r.
func (r BlockRange) End() uint64 { return r.Begin + r.Length }

// MappedBlocks calls emit with the blocks of thin id that have data blocks
// behind them, in ascending order, adjacent runs merged. NotFound when the
// pool holds no such id. emit's error stops the listing and is returned.
func (p *Pool) MappedBlocks(ctx context.Context, id uint32, emit func(BlockRange) error) error {
	if err := p.checkThin(id, 1); err != nil {
		return err
	}
	return p.withMetadataSnapshot(ctx, func(meta string) error {
		return dumpMappings(ctx, meta, true, id, emit)
	})
}

// ChangedBlocks calls emit with the blocks whose contents may differ
// between thin devices base and target (a snapshot and a later snapshot of
// the same volume): mapped to different data blocks, or mapped in one of
// them only. Blocks both map to the same data block (shared since the
// older was taken) are unchanged and never read. Ascending, adjacent runs
// merged. NotFound when either id is missing.
func (p *Pool) ChangedBlocks(ctx context.Context, base, target uint32, emit func(BlockRange) error) error {
	if err := p.checkThin(base, 1); err != nil {
		return err
	}
	if err := p.checkThin(target, 1); err != nil {
		return err
	}
	return p.withMetadataSnapshot(ctx, func(meta string) error {
		return dumpDelta(ctx, meta, true, base, target, emit)
	})
}

// metadataSnapshots serialises the users of each pool's metadata snapshot:
// the kernel keeps one per pool, so a second reserve fails until the first
// is released. A channel per pool name, so a waiter can give up with its
// context.
var metadataSnapshots sync.Map // pool name -> chan struct{} (capacity 1)

// withMetadataSnapshot runs fn on the path of the pool's metadata device
// while the pool holds a metadata snapshot, and releases the snapshot
// afterwards, also when fn fails. A snapshot already held when it starts
// was left by a reader that died before releasing it (this daemon
// serialises its own readers), so it is released first: a held snapshot
// also keeps the metadata blocks it references from being reused.
func (p *Pool) withMetadataSnapshot(ctx context.Context, fn func(meta string) error) error {
	if err := p.bound(); err != nil {
		return err
	}
	sem, _ := metadataSnapshots.LoadOrStore(p.Name, make(chan struct{}, 1))
	select {
	case sem.(chan struct{}) <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("dm pool %s: wait for its metadata snapshot: %w", p.Name, ctx.Err())
	}
	defer func() { <-sem.(chan struct{}) }()

	meta, err := devicePath(p.MetaDev)
	if err != nil {
		return fmt.Errorf("dm pool %s: metadata device: %w", p.Name, err)
	}
	st, err := p.Status(ctx)
	if err != nil {
		return err
	}
	if st.Failed {
		return abi.Errorf(abi.FailedPrecondition, "dm pool %s has failed: its metadata cannot be read", p.Name)
	}
	if st.HeldMetaRoot != "" && st.HeldMetaRoot != "-" {
		if err := p.message(ctx, "release_metadata_snap"); err != nil {
			return fmt.Errorf("dm pool %s: release a metadata snapshot left held: %w", p.Name, err)
		}
	}
	if err := p.message(ctx, "reserve_metadata_snap"); err != nil {
		return fmt.Errorf("dm pool %s: reserve a metadata snapshot: %w", p.Name, err)
	}
	err = fn(meta)
	if rerr := p.message(context.WithoutCancel(ctx), "release_metadata_snap"); rerr != nil {
		err = errors.Join(err, fmt.Errorf("dm pool %s: release its metadata snapshot: %w", p.Name, rerr))
	}
	return err
}

// devicePath turns a device as a table names it ("major:minor") into a
// node the tools can open; a path is returned as it is.
func devicePath(dev string) (string, error) {
	if strings.HasPrefix(dev, "/") {
		return dev, nil
	}
	uevent, err := os.ReadFile(filepath.Join("/sys/dev/block", dev, "uevent"))
	if err != nil {
		return "", fmt.Errorf("device %s: %w", dev, err)
	}
	for _, line := range strings.Split(string(uevent), "\n") {
		if name, ok := strings.CutPrefix(line, "DEVNAME="); ok && name != "" {
			return "/dev/" + name, nil
		}
	}
	return "", fmt.Errorf("device %s: its uevent names no node", dev)
}

// dumpMappings runs thin_dump for thin id of the metadata at meta (its
// held snapshot when metaSnap) and emits the mapped ranges.
func dumpMappings(ctx context.Context, meta string, metaSnap bool, id uint32, emit func(BlockRange) error) error {
	args := []string{"--dev-id", itoa(id), meta}
	if metaSnap {
		args = append([]string{"--metadata-snap"}, args...)
	}
	found := false
	err := runTool(ctx, "thin_dump", args, func(r io.Reader) error {
		m := merger{emit: emit}
		d := xml.NewDecoder(r)
		for {
			tok, err := d.Token()
			if err == io.EOF {
				return m.flush()
			}
			if err != nil {
				return fmt.Errorf("thin_dump output: %w", err)
			}
			el, ok := tok.(xml.StartElement)
			if !ok {
				continue
			}
			var rg BlockRange
			switch el.Name.Local {
			case "device":
				dev, err := attrUint(el, "dev_id")
				if err != nil {
					return err
				}
				found = found || dev == uint64(id)
				continue
			case "range_mapping":
				if rg.Begin, err = attrUint(el, "origin_begin"); err == nil {
					rg.Length, err = attrUint(el, "length")
				}
			case "single_mapping":
				rg.Begin, err = attrUint(el, "origin_block")
				rg.Length = 1
			default:
				continue
			}
			if err != nil {
				return err
			}
			if err := m.add(rg); err != nil {
				return err
			}
		}
	})
	if err == nil && !found {
		return abi.Errorf(abi.NotFound, "thin_dump: the pool holds no thin device %s", itoa(id))
	}
	return err
}

// dumpDelta runs thin_delta between thin devices base and target of the
// metadata at meta and emits the ranges that differ.
func dumpDelta(ctx context.Context, meta string, metaSnap bool, base, target uint32, emit func(BlockRange) error) error {
	args := []string{"--snap1", itoa(base), "--snap2", itoa(target), meta}
	if metaSnap {
		args = append([]string{"--metadata-snap"}, args...)
	}
	return runTool(ctx, "thin_delta", args, func(r io.Reader) error {
		m := merger{emit: emit}
		d := xml.NewDecoder(r)
		for {
			tok, err := d.Token()
			if err == io.EOF {
				return m.flush()
			}
			if err != nil {
				return fmt.Errorf("thin_delta output: %w", err)
			}
			el, ok := tok.(xml.StartElement)
			if !ok {
				continue
			}
			switch el.Name.Local {
			case "different", "left_only", "right_only":
			default:
				continue
			}
			var rg BlockRange
			if rg.Begin, err = attrUint(el, "begin"); err == nil {
				rg.Length, err = attrUint(el, "length")
			}
			if err != nil {
				return err
			}
			if err := m.add(rg); err != nil {
				return err
			}
		}
	})
}

// merger joins adjacent ranges before emitting them: the tools print one
// range per run of contiguous data blocks, and a volume's runs are often
// contiguous in the volume but not on the data device.
type merger struct {
	emit    func(BlockRange) error
	pending BlockRange
}

func (m *merger) add(r BlockRange) error {
	if r.Length == 0 {
		return nil
	}
	switch {
	case m.pending.Length == 0:
		m.pending = r
		return nil
	case r.Begin == m.pending.End():
		m.pending.Length += r.Length
		return nil
	case r.Begin < m.pending.End():
		return abi.Errorf(abi.Internal, "thin metadata: range %+v after %+v is out of order", r, m.pending)
	}
	if err := m.emit(m.pending); err != nil {
		return err
	}
	m.pending = r
	return nil
}

func (m *merger) flush() error {
	if m.pending.Length == 0 {
		return nil
	}
	r := m.pending
	m.pending = BlockRange{}
	return m.emit(r)
}

func attrUint(el xml.StartElement, name string) (uint64, error) {
	for _, a := range el.Attr {
		if a.Name.Local == name {
			v, err := strconv.ParseUint(a.Value, 10, 64)
			if err != nil {
				return 0, abi.Errorf(abi.Internal, "thin metadata: <%s %s=%q>: %v", el.Name.Local, name, a.Value, err)
			}
			return v, nil
		}
	}
	return 0, abi.Errorf(abi.Internal, "thin metadata: <%s> without %s", el.Name.Local, name)
}

// runTool runs one of thin-provisioning-tools and hands its output to
// parse as it comes. A tool that is not installed is FailedPrecondition;
// a thin id it cannot find NotFound.
func runTool(ctx context.Context, tool string, args []string, parse func(io.Reader) error) error {
	path, err := exec.LookPath(tool)
	if err != nil {
		return abi.Errorf(abi.FailedPrecondition, "%s not found: install thin-provisioning-tools to read thin pools' metadata", tool)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &limitedWriter{w: &stderr, n: 4096}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("%s: %w", tool, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", tool, err)
	}
	perr := parse(out)
	if perr != nil {
		// Stop reading: the tool must not block on a full pipe.
		_ = cmd.Process.Kill()
		_, _ = io.Copy(io.Discard, out)
	}
	werr := cmd.Wait()
	if perr != nil {
		return perr
	}
	if werr != nil {
		msg := strings.TrimSpace(stderr.String())
		code := abi.Internal
		if strings.Contains(msg, "Unable to find mapping tree") || strings.Contains(msg, "unknown device") {
			code = abi.NotFound
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s: %w", tool, strings.Join(args, " "), ctx.Err())
		}
		return abi.Errorf(code, "%s %s: %v: %s", tool, strings.Join(args, " "), werr, msg)
	}
	return nil
}

// limitedWriter keeps the first n bytes written to it.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}
