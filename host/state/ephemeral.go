package state

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/wasmcsi/wasmcsi/abi/wire"
)

// Ephemeral is a CSI ephemeral inline volume on this node, keyed by the
// volume_id the CO chose for it (not a wasmcsi ID: the CO never sees the
// ID of the volume the node created). It is written before each phase's
// work, so that a retry or a start-up after a crash knows what may exist
// and finishes or undoes it.
type Ephemeral struct {
	COVolumeID string `wire:"1"`
	Phase      string `wire:"2"` // EphemeralPublishing, EphemeralPublished or EphemeralDeleting
	Backend    string `wire:"3"`
	// Name, Parameters, RequiredBytes and Capability are the create_volume
	// request, kept so that a repeat finds the volume a crash left unnamed.
	Name          string            `wire:"4"`
	Parameters    map[string]string `wire:"5"`
	RequiredBytes int64             `wire:"6"`
	Capability    Capability        `wire:"7"`
	ReadOnly      bool              `wire:"8"`
	TargetPath    string            `wire:"9"`
	StagingPath   string            `wire:"10"` // chosen by the host: the CO stages no inline volume
	// VolumeID, CapacityBytes and Context are create_volume's answer, once
	// it has come.
	VolumeID      string            `wire:"11"`
	CapacityBytes int64             `wire:"12"`
	Context       map[string]string `wire:"13"`
	CreatedAt     time.Time         `wire:"14"`
}

// Phases of an ephemeral inline volume.
const (
	// EphemeralPublishing: NodePublishVolume is creating, staging or
	// publishing the volume, or crashed doing so.
	EphemeralPublishing = "publishing"
	// EphemeralPublished: NodePublishVolume answered success.
	EphemeralPublished = "published"
	// EphemeralDeleting: NodeUnpublishVolume (or the undo of a failed
	// publish) is taking the volume down, or crashed doing so.
	EphemeralDeleting = "deleting"
)

var ephemeralTable = &table[Ephemeral, *Ephemeral]{
	kind: "ephemeral", kinds: "ephemerals", bucket: bucketEphemeral, listing: listEphemerals,
	check: func(e *Ephemeral) error { return checkKey("volume ID", e.COVolumeID) },
	key:   func(e *Ephemeral) string { return e.COVolumeID },
	index: func(tx *txn, e *Ephemeral, old []byte) (func() error, error) {
		return func() error {
			if err := unindexEphemeral(tx, e.COVolumeID, old, e.VolumeID); err != nil || e.VolumeID == "" {
				return err
			}
			return tx.Bucket(bucketEphemeralVolumes).Put([]byte(e.VolumeID), []byte(e.COVolumeID))
		}, nil
	},
	unindex: func(tx *txn, coVolumeID string, old []byte) (func() error, error) {
		return func() error { return unindexEphemeral(tx, coVolumeID, old, "") }, nil
	},
}

// PutEphemeral records e, replacing any earlier record of its CO volume
// ID, and returns once it is durable.
func (s *Store) PutEphemeral(e Ephemeral) error { return ephemeralTable.put(s.write, e, false) }

// unindexEphemeral drops the ephemeral_volumes entry of old, the record of
// coVolumeID being replaced or deleted (nil: none), unless it names keep
// or another record's volume.
func unindexEphemeral(tx *txn, coVolumeID string, old []byte, keep string) error {
	if old == nil {
		return nil
	}
	e, err := decode[Ephemeral](old)
	if err != nil {
		return corrupt("ephemeral", coVolumeID, err)
	}
	if e.VolumeID == "" || e.VolumeID == keep {
		return nil
	}
	idx := tx.Bucket(bucketEphemeralVolumes)
	if string(idx.Get([]byte(e.VolumeID))) != coVolumeID {
		return nil
	}
	return idx.Delete([]byte(e.VolumeID))
}

// EphemeralByVolumeID returns the record of the ephemeral volume whose
// node volume is volumeID, or ErrNotFound: one read of an index, however
// many ephemeral volumes the node holds.
func (s *Store) EphemeralByVolumeID(volumeID string) (Ephemeral, error) {
	var e Ephemeral
	var found bool
	err := s.view(func(tx *txn) error {
		co := tx.Bucket(bucketEphemeralVolumes).Get([]byte(volumeID))
		if co == nil {
			return nil
		}
		b := tx.Bucket(bucketEphemeral).Get(co)
		if b == nil {
			return corrupt("ephemeral_volumes index", volumeID, fmt.Errorf("no ephemeral %s", co))
		}
		var err error
		if e, err = decode[Ephemeral](b); err != nil {
			return corrupt("ephemeral", string(co), err)
		}
		found = true
		return nil
	})
	if err == nil && !found {
		err = ErrNotFound
	}
	if err != nil {
		return Ephemeral{}, fmt.Errorf("ephemeral of volume %s: %w", volumeID, err)
	}
	return e, nil
}

// readableString returns the last occurrence of string field f that the
// bytes of a damaged record hold before the damage.
func readableString(b []byte, f int) (v string, ok bool) {
	d := wire.NewDecoder(b)
	for !d.Done() {
		g, t, err := d.Next()
		if err != nil {
			break
		}
		if g != f {
			if d.Skip(g, t) != nil {
				break
			}
			continue
		}
		s, err := d.String(t)
		if err != nil {
			break
		}
		v, ok = s, true
	}
	return v, ok
}

// ephemeralVolumeIDField is Ephemeral.VolumeID's field number.
const ephemeralVolumeIDField = 11

// indexEphemeralVolumes fills ephemeral_volumes from the ephemeral records.
// A record the full decode refuses is indexed by its volume ID when that
// field alone reads, so that the ID never passes for a free one.
func indexEphemeralVolumes(tx *bolt.Tx) error {
	idx := tx.Bucket(bucketEphemeralVolumes)
	return tx.Bucket(bucketEphemeral).ForEach(func(k, b []byte) error {
		id := ""
		if e, err := decode[Ephemeral](b); err == nil {
			id = e.VolumeID
		} else if id, _ = readableString(b, ephemeralVolumeIDField); id == "" {
			// Not even its volume ID reads: no index entry can be made,
			// and refusing the whole file would stop every volume.
			// Reading the record answers DATA_LOSS.
			return nil
		}
		if id == "" {
			return nil
		}
		return idx.Put([]byte(id), k)
	})
}

// GetEphemeral returns the record of the ephemeral volume the CO calls
// coVolumeID, or ErrNotFound.
func (s *Store) GetEphemeral(coVolumeID string) (Ephemeral, error) {
	return ephemeralTable.get(s, coVolumeID)
}

// DeleteEphemeral removes the record once durable, or returns ErrNotFound.
func (s *Store) DeleteEphemeral(coVolumeID string) error {
	return ephemeralTable.delete(s.write, coVolumeID)
}

// ListEphemerals returns every ephemeral volume record, in CO volume ID
// order.
func (s *Store) ListEphemerals() ([]Ephemeral, error) { return ephemeralTable.all(s) }
