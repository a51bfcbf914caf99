package main

import (
	"strconv"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/sdk/hostcall"
)

// Thin ids and the records that make them idempotent (README: "Thin ids").
//
// A thin pool numbers its devices (24-bit ids) and keeps no names and no
// sizes. The module therefore keeps two record files per thin device in its
// state folder, both empty sparse files whose apparent size is the datum,
// because the file host calls carry sizes, not contents:
//
//   - <pool>-<id>.claim: the id's owner. Its size is 1 + the top 40 bits of
//     the owner's 64-bit FNV-1a hash ("v/<name>" for volumes, "s/<name>"
//     for snapshots). file_create links it in atomically and answers
//     ALREADY_EXISTS when the file has another size, so exactly one owner
//     can claim an id, and the same owner finds its own claim again.
//   - <pool>-<id>.size: the thin device's virtual size in bytes, which the
//     device-mapper table needs at every activation and which grows with
//     expansion (a CO keeps the volume context of the creation, so the
//     context's size goes stale after an expansion).
//
// An owner's ids are probed from its home slot, the low 24 bits of the same
// hash: id_i = 1 + (home + i) mod (2^24 - 1). Creating claims the first id
// that is free or already ours, then records the size, then creates the
// thin device; a repeat after a crash walks the same probe sequence to the
// same claim and finds whatever of the later steps already happened.
// Deleting goes the other way: thin device, size, claim.

const (
	maxThinID = 1<<24 - 1
	// maxProbes bounds the search for a free id. A pool's metadata holds
	// far fewer thin devices than the id space, so a long run of taken ids
	// means the ids are exhausted in practice.
	maxProbes = 128
	// ownerBits of the hash go into a claim's size: 2^40 bytes stays well
	// inside every filesystem's largest sparse file.
	ownerBits = 40

	kindVolume   = 't'
	kindSnapshot = 's'
)

// owner identifies who may claim which ids.
type owner struct {
	home uint32 // first id slot
	tag  int64  // the claim file's size
}

func ownerOf(kind byte, name string) owner {
	h := fnv64(kind, name)
	return owner{home: uint32(h & (1<<24 - 1)), tag: int64(h>>(64-ownerBits)) + 1}
}

// fnv64 is FNV-1a over kind, "/" and name: stable across toolchains and
// releases, with no hash package needed.
func fnv64(kind byte, name string) uint64 {
	h := uint64(14695981039346656037)
	step := func(c byte) {
		h ^= uint64(c)
		h *= 1099511628211
	}
	step(kind)
	step('/')
	for i := 0; i < len(name); i++ {
		step(name[i])
	}
	return h
}

// probe returns owner o's i-th candidate id, from 1 to maxThinID.
func (o owner) probe(i int) uint32 {
	return 1 + uint32((uint64(o.home)+uint64(i))%maxThinID)
}

func (b *Backend) claimPath(id uint32) string { return b.recordPath(id, ".claim") }
func (b *Backend) sizePath(id uint32) string  { return b.recordPath(id, ".size") }

func (b *Backend) recordPath(id uint32, suffix string) string {
	return b.cfg.state + "/" + b.cfg.pool + "-" + u64(uint64(id)) + suffix
}

// claim returns the id o owns: one it claimed before, or the first free
// id of its probe sequence, which it claims now.
func (b *Backend) claim(o owner) (uint32, error) {
	for i := 0; i < maxProbes; i++ {
		id := o.probe(i)
		err := hostcall.FileCreate(&abi.FileCreateRequest{Path: b.claimPath(id), SizeBytes: o.tag})
		switch abi.CodeOf(err) {
		case abi.OK:
			return id, nil
		case abi.AlreadyExists:
			// Another owner's id (or something else under that name).
		default:
			return 0, wrap(err, "claim thin id ", u64(uint64(id)))
		}
	}
	return 0, errorf(abi.ResourceExhausted, "no free thin id among ", strconv.Itoa(maxProbes), " candidates in pool ", b.cfg.pool)
}

// recordSize records a new thin device's size. A record of another size
// means the name was used with other arguments.
func (b *Backend) recordSize(id uint32, size int64, what string) error {
	err := hostcall.FileCreate(&abi.FileCreateRequest{Path: b.sizePath(id), SizeBytes: size})
	if abi.CodeOf(err) == abi.AlreadyExists {
		if have, ok := b.recordedSize(id); ok {
			return errorf(abi.AlreadyExists, what, " exists with ", i64(have), " bytes, not ", i64(size))
		}
	}
	if err != nil {
		return wrap(err, "record size of thin ", u64(uint64(id)))
	}
	return nil
}

// recordedSize answers the size record of thin id, if there is one.
func (b *Backend) recordedSize(id uint32) (int64, bool) {
	st, err := hostcall.FileStat(b.sizePath(id))
	if err != nil || st.SizeBytes <= 0 {
		return 0, false
	}
	return st.SizeBytes, true
}

// growRecord raises the size record of thin id to size (never lowers it).
func (b *Backend) growRecord(id uint32, size int64) error {
	have, ok := b.recordedSize(id)
	var err error
	switch {
	case !ok:
		err = hostcall.FileCreate(&abi.FileCreateRequest{Path: b.sizePath(id), SizeBytes: size})
	case have < size:
		err = hostcall.FileResize(&abi.FileResizeRequest{Path: b.sizePath(id), SizeBytes: size})
	}
	if err != nil {
		return wrap(err, "record size of thin ", u64(uint64(id)))
	}
	return nil
}

// dropRecords removes the size record, then the claim; missing ones are
// success.
func (b *Backend) dropRecords(id uint32) error {
	for _, p := range []string{b.sizePath(id), b.claimPath(id)} {
		if err := hostcall.FileRemove(p); err != nil {
			return wrap(err, "remove record ", p)
		}
	}
	return nil
}

// Local IDs: "t-<id>" for volumes, "s-<id>" for snapshots.

func localID(kind byte, id uint32) string { return string(kind) + "-" + u64(uint64(id)) }

// parseLocalID reads a local ID of kind; ok is false for anything this
// module never issued.
func parseLocalID(kind byte, s string) (uint32, bool) {
	if len(s) < 3 || s[0] != kind || s[1] != '-' || s[2] == '0' || s[2] == '+' {
		return 0, false
	}
	n, err := strconv.ParseUint(s[2:], 10, 32)
	if err != nil || n == 0 || n > maxThinID {
		return 0, false
	}
	return uint32(n), true
}

// Context keys of volumes and snapshots. The context travels with the
// volume to nodes; the size there is the size at creation (see records).
const (
	ctxPool = "pool"
	ctxID   = "thinID"
	ctxSize = "sizeBytes"
	ctxNode = "node"
)

func (b *Backend) context(id uint32, size int64) map[string]string {
	return map[string]string{ctxPool: b.cfg.pool, ctxID: u64(uint64(id)), ctxSize: i64(size), ctxNode: b.cfg.node}
}

// inPool checks that a volume or snapshot context names this module's
// pool on this node: after a reconfiguration, or on another node (whose
// pool may well have the same name), the id would name another device.
// Contexts without a node (older builds) are checked by pool only.
func (b *Backend) inPool(ctx map[string]string, what, local string) error {
	p, ok := ctx[ctxPool]
	n := ctx[ctxNode]
	if (ok && p != b.cfg.pool) || (n != "" && n != b.cfg.node) {
		if !ok {
			p = "?"
		}
		where := p
		if n != "" {
			where += " on node " + n
		}
		return errorf(abi.NotFound, what, " ", local, " lives in pool ", where, "; this module serves pool ", b.cfg.pool, " on node ", b.cfg.node)
	}
	return nil
}

// sizeOf is the current size of thin id: its record, else the context's
// size, else fallback.
func (b *Backend) sizeOf(id uint32, ctx map[string]string, fallback int64) int64 {
	if n, ok := b.recordedSize(id); ok {
		return n
	}
	if n, err := strconv.ParseInt(strings.TrimSpace(ctx[ctxSize]), 10, 64); err == nil && n > 0 {
		return n
	}
	return fallback
}
