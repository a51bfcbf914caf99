package state

import (
	"fmt"
	"time"

	"github.com/wasmcsi/wasmcsi/abi/wire"
)

// Ephemeral is a CSI ephemeral inline volume on this node, keyed by the
// volume_id the CO chose for it (not a wasmcsi ID: the CO never sees the
// ID of the volume the node created). It is written before each phase's
// work, so that a retry or a start-up after a crash knows what may exist
// and finishes or undoes it.
type Ephemeral struct {
	COVolumeID string
	Phase      string // EphemeralPublishing, EphemeralPublished or EphemeralDeleting
	Backend    string
	// Name, Parameters, RequiredBytes and Capability are the create_volume
	// request, kept so that a repeat finds the volume a crash left unnamed.
	Name          string
	Parameters    map[string]string
	RequiredBytes int64
	Capability    Capability
	ReadOnly      bool
	TargetPath    string
	StagingPath   string // chosen by the host: the CO stages no inline volume
	// VolumeID, CapacityBytes and Context are create_volume's answer, once
	// it has come.
	VolumeID      string
	CapacityBytes int64
	Context       map[string]string
	CreatedAt     time.Time
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

// PutEphemeral records e, replacing any earlier record of its CO volume
// ID, and returns once it is durable.
func (s *Store) PutEphemeral(e Ephemeral) error {
	if err := checkKey("volume ID", e.COVolumeID); err != nil {
		return err
	}
	val, err := encodeEphemeral(&e)
	if err != nil {
		return fmt.Errorf("put ephemeral %s: %w", e.COVolumeID, invalid(err))
	}
	err = s.write(func(tx *txn) error {
		return tx.Bucket(bucketEphemeral).Put([]byte(e.COVolumeID), val)
	})
	if err != nil {
		return fmt.Errorf("put ephemeral %s: %w", e.COVolumeID, err)
	}
	return nil
}

// GetEphemeral returns the record of the ephemeral volume the CO calls
// coVolumeID, or ErrNotFound.
func (s *Store) GetEphemeral(coVolumeID string) (Ephemeral, error) {
	var e Ephemeral
	found, err := s.get(bucketEphemeral, []byte(coVolumeID), func(b []byte) (err error) {
		if e, err = decodeEphemeral(b); err != nil {
			return corrupt("ephemeral", coVolumeID, err)
		}
		return nil
	})
	if err == nil && !found {
		err = ErrNotFound
	}
	if err != nil {
		return Ephemeral{}, fmt.Errorf("ephemeral %s: %w", coVolumeID, err)
	}
	return e, nil
}

// DeleteEphemeral removes the record once durable, or returns ErrNotFound.
func (s *Store) DeleteEphemeral(coVolumeID string) error {
	err := s.write(func(tx *txn) error {
		b := tx.Bucket(bucketEphemeral)
		if b.Get([]byte(coVolumeID)) == nil {
			return refuse(ErrNotFound)
		}
		return b.Delete([]byte(coVolumeID))
	})
	if err != nil {
		return fmt.Errorf("delete ephemeral %s: %w", coVolumeID, err)
	}
	return nil
}

// ListEphemerals returns every ephemeral volume record, in CO volume ID
// order.
func (s *Store) ListEphemerals() ([]Ephemeral, error) {
	var out []Ephemeral
	_, err := s.page(listEphemerals, bucketEphemeral, nil, "", 0, func(_ *txn, k, b []byte) error {
		e, err := decodeEphemeral(b)
		if err != nil {
			return corrupt("ephemeral", string(k), err)
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list ephemerals: %w", err)
	}
	return out, nil
}

func encodeEphemeral(v *Ephemeral) ([]byte, error) {
	e := encoder{b: make([]byte, 0, 256)}
	e.str(1, v.COVolumeID)
	e.str(2, v.Phase)
	e.str(3, v.Backend)
	e.str(4, v.Name)
	e.strMap(5, v.Parameters)
	e.int(6, v.RequiredBytes)
	m := e.begin(7)
	e.bool(1, v.Capability.Block)
	e.str(2, v.Capability.FsType)
	e.strs(3, v.Capability.MountFlags)
	e.int(4, int64(v.Capability.AccessMode))
	e.end(m)
	e.bool(8, v.ReadOnly)
	e.str(9, v.TargetPath)
	e.str(10, v.StagingPath)
	e.str(11, v.VolumeID)
	e.int(12, v.CapacityBytes)
	e.strMap(13, v.Context)
	e.time(14, v.CreatedAt)
	return e.result()
}

func decodeEphemeral(b []byte) (v Ephemeral, err error) {
	err = decodeFields("Ephemeral", wire.NewDecoder(b), func(d *wire.Decoder, field int, t wire.Type) (err error) {
		switch field {
		case 1:
			v.COVolumeID, err = d.String(t)
		case 2:
			v.Phase, err = d.String(t)
		case 3:
			v.Backend, err = d.String(t)
		case 4:
			v.Name, err = d.String(t)
		case 5:
			err = d.StringMapEntry(t, &v.Parameters)
		case 6:
			v.RequiredBytes, err = d.Int64(t)
		case 7:
			v.Capability, err = decodeCapability(d, t)
		case 8:
			v.ReadOnly, err = d.Bool(t)
		case 9:
			v.TargetPath, err = d.String(t)
		case 10:
			v.StagingPath, err = d.String(t)
		case 11:
			v.VolumeID, err = d.String(t)
		case 12:
			v.CapacityBytes, err = d.Int64(t)
		case 13:
			err = d.StringMapEntry(t, &v.Context)
		case 14:
			v.CreatedAt, err = decodeTime(d, t)
		default:
			err = d.Skip(field, t)
		}
		return err
	})
	return v, err
}
