package state

import (
	"fmt"
	"time"
)

var intentTable = &table[Intent, *Intent]{
	kind: "intent", kinds: "intents", bucket: bucketIntents, listing: listIntents,
	check: func(v *Intent) error { return checkKey("intent key", v.Key) },
	key:   func(v *Intent) string { return v.Key },
}

// LogIntent records the intent, replacing one of the same key, and returns
// once it is durable: the one sync a controller operation waits for.
func (s *Store) LogIntent(v Intent) error { return intentTable.put(s.write, v, false) }

// DropIntentSoon removes the intent of key that was logged at created
// without waiting for the disk. One that is gone, or that a later LogIntent
// replaced, stays as it is. The caller drops an intent only once what it
// describes is durable, and the log keeps the order of writes, so the
// removal never reaches the disk before what it completes.
func (s *Store) DropIntentSoon(key string, created time.Time) error {
	err := s.writeSoon(func(tx *txn) error {
		b := tx.Bucket(bucketIntents)
		old := b.Get([]byte(key))
		if old == nil {
			return nil
		}
		v, err := intentTable.decodeAt(key, old)
		if err != nil {
			return err
		}
		if !v.CreatedAt.Equal(created) {
			return nil
		}
		return b.Delete([]byte(key))
	})
	if err != nil {
		return fmt.Errorf("drop intent %s: %w", key, err)
	}
	return nil
}

// GetIntent returns the intent of key, or ErrNotFound.
func (s *Store) GetIntent(key string) (Intent, error) { return intentTable.get(s, key) }

// ListIntents returns every logged intent in key order.
func (s *Store) ListIntents() ([]Intent, error) { return intentTable.all(s) }
