package state

import (
	"errors"
	"fmt"
)

var intentTable = &table[Intent]{
	kind: "intent", bucket: bucketIntents,
	encode: encodeIntent, decode: decodeIntent,
	check: func(v *Intent) error { return checkKey("intent key", v.Key) },
	id:    func(v *Intent) string { return v.Key },
}

// LogIntent records the intent, replacing one of the same key, and returns
// once it is durable: the one sync a controller operation waits for.
func (s *Store) LogIntent(v Intent) error { return intentTable.put(s.write, v, false) }

// DropIntentSoon removes the intent of key without waiting for the disk;
// one that is not there is fine. The caller drops an intent only once what
// it describes is durable, and the log keeps the order of writes, so the
// removal never reaches the disk before the record it completes.
func (s *Store) DropIntentSoon(key string) error {
	if err := intentTable.delete(s.writeSoon, key); err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// GetIntent returns the intent of key, or ErrNotFound.
func (s *Store) GetIntent(key string) (Intent, error) { return intentTable.get(s, key) }

// ListIntents returns every logged intent in key order.
func (s *Store) ListIntents() ([]Intent, error) {
	var out []Intent
	if _, err := s.page(listIntents, bucketIntents, nil, "", 0, intentTable.collect(&out)); err != nil {
		return nil, fmt.Errorf("list intents: %w", err)
	}
	return out, nil
}
