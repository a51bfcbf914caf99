package host

import (
	"sync"

	"github.com/wasmcsi/wasmcsi/host/state"
)

// SetUnpaged sets the byte budget and the chunk size of List answers
// without max_entries, for the tests of the package's external test
// package, and returns what restores them.
func SetUnpaged(budget, chunk int) (restore func()) {
	oldBudget, oldChunk := unpagedBudget, unpagedChunk
	unpagedBudget, unpagedChunk = budget, chunk
	return func() { unpagedBudget, unpagedChunk = oldBudget, oldChunk }
}

// VolumeRecord is the server's record of volume id, also while it is
// marked Deleting.
func (s *Server) VolumeRecord(id string) (state.Volume, error) { return s.store.VolumeRecord(id) }

// Settling reports whether a settler batch still holds the completion of
// key: a volume ID, or the intent key of a create.
func (s *Server) Settling(key string) bool { return s.settle.settling(key) }

// HoldSettler stops the settler in the middle of a batch and returns what
// lets it go on: operations queued meanwhile wait for a later batch, so a
// test can change their pool folders before any of them is synced.
func (s *Server) HoldSettler() (release func()) {
	entered, hold := make(chan struct{}), make(chan struct{})
	s.settle.add("test-hold", nil, func() error {
		close(entered)
		<-hold
		return nil
	})
	<-entered
	return sync.OnceFunc(func() { close(hold) })
}

// ForgetPublication deletes the publication record of volume id at
// target, as a crash that lost the record before its sync does.
func (s *Server) ForgetPublication(id, target string) error { return s.store.DeletePublish(id, target) }

// ForgetStage deletes the stage record of volume id, as a crash between a
// new stage's mount and its record's sync does.
func (s *Server) ForgetStage(id string) error { return s.store.DeleteStage(id) }

// ListenPrivate is listenPrivate, for the socket tests.
var ListenPrivate = listenPrivate
