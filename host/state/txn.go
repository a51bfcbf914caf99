package state

import (
	"bytes"
	"errors"
	"hash/maphash"

	bolt "go.etcd.io/bbolt"
)

// The overlay holds the changes that are in the log but not yet in bbolt.
// It is one or two layers: the active layer takes new writes; while a
// checkpoint copies a layer into bbolt that layer is frozen and a new active
// layer takes over. Reads look into the active layer, then the frozen one,
// then bbolt.
//
// A layer is a persistent (path-copying) treap per bucket. A published
// layer is never modified: a write call builds a new version that shares
// every node it did not touch, and publishes it with its record. So a reader
// that has loaded a pair of layers reads them without locks, however long it
// takes, while writers and checkpoints go on.

// numBuckets is len(allBuckets); a layer has one tree per bucket.
const numBuckets = 15

// node is one key of a layer: a value, or a tombstone hiding the key in the
// layers below and in bbolt.
type node struct {
	key, val    []byte
	del         bool
	prio        uint64 // heap order of the treap, from a hash of key
	left, right *node
}

// layer is one version of a set of changes.
type layer struct {
	roots   [numBuckets]*node
	entries int // keys in all trees
}

// layers is what readers load: the active layer and, while a checkpoint
// runs, the frozen one.
type layers struct {
	active *layer
	frozen *layer // nil when no checkpoint is writing a layer to bbolt
}

// treapSeed randomizes node priorities, so no choice of keys can make a
// tree degenerate into a list.
var treapSeed = maphash.MakeSeed()

// get returns the node of key k in bucket b, or nil.
func (l *layer) get(b int, k []byte) *node {
	n := l.roots[b]
	for n != nil {
		switch c := bytes.Compare(k, n.key); {
		case c == 0:
			return n
		case c < 0:
			n = n.left
		default:
			n = n.right
		}
	}
	return nil
}

// insert returns a tree that is n with k set to v (or to a tombstone),
// copying the nodes on the path and leaving n as it was; added reports
// whether k is new to the tree.
func insert(n *node, k, v []byte, del bool, prio uint64) (out *node, added bool) {
	if n == nil {
		return &node{key: k, val: v, del: del, prio: prio}, true
	}
	m := *n
	switch c := bytes.Compare(k, n.key); {
	case c == 0:
		m.val, m.del = v, del
		return &m, false
	case c < 0:
		m.left, added = insert(n.left, k, v, del, prio)
		if l := m.left; l.prio > m.prio {
			// l is a fresh copy, so rotating changes no shared node.
			m.left, l.right = l.right, &m
			return l, added
		}
	default:
		m.right, added = insert(n.right, k, v, del, prio)
		if r := m.right; r.prio > m.prio {
			m.right, r.left = r.left, &m
			return r, added
		}
	}
	return &m, added
}

// treeIter walks a tree in key order.
type treeIter struct {
	stack []*node // the current node on top, then the ancestors still to visit
}

// seek positions the iterator at the first key at or after k.
func (it *treeIter) seek(root *node, k []byte) {
	it.stack = it.stack[:0]
	for n := root; n != nil; {
		if bytes.Compare(n.key, k) >= 0 {
			it.stack = append(it.stack, n)
			n = n.left
		} else {
			n = n.right
		}
	}
}

// node returns the current node, nil past the end.
func (it *treeIter) node() *node {
	if len(it.stack) == 0 {
		return nil
	}
	return it.stack[len(it.stack)-1]
}

// next moves to the following key.
func (it *treeIter) next() {
	n := it.stack[len(it.stack)-1]
	it.stack = it.stack[:len(it.stack)-1]
	for m := n.right; m != nil; m = m.left {
		it.stack = append(it.stack, m)
	}
}

// change is one put or delete of a write call, as the log records it.
type change struct {
	bucket byte // index in allBuckets
	del    bool
	key    []byte
	val    []byte
}

// errReadOnly is a programming error: a read call tried to write.
var errReadOnly = errors.New("write in a read-only state transaction")

// txn is one call's view of the store: the overlay layers over a bbolt read
// transaction. A write call's txn also collects the call's changes, in a
// private version of the active layer that it reads back, and in the list
// that becomes the call's log record.
type txn struct {
	tx       *bolt.Tx
	active   *layer
	frozen   *layer
	writable bool
	own      bool // active is this txn's private copy
	changes  []change
}

// Bucket returns the named bucket (one of allBuckets) of the view.
func (t *txn) Bucket(name []byte) bucket {
	for i, n := range allBuckets {
		if bytes.Equal(n, name) {
			return bucket{t: t, id: i, b: t.tx.Bucket(name)}
		}
	}
	panic("state: no bucket " + string(name))
}

// set records a put (or a delete, del) of k in bucket b.
func (t *txn) set(b int, k, v []byte, del bool) error {
	if !t.writable {
		return errReadOnly
	}
	if !t.own {
		l := *t.active
		t.active, t.own = &l, true
	}
	root, added := insert(t.active.roots[b], k, v, del, maphash.Bytes(treapSeed, k))
	t.active.roots[b] = root
	if added {
		t.active.entries++
	}
	t.changes = append(t.changes, change{bucket: byte(b), del: del, key: k, val: v})
	return nil
}

// bucket is one bucket of a txn, with the methods of a bbolt bucket that
// the store uses.
type bucket struct {
	t  *txn
	id int
	b  *bolt.Bucket
}

// Get returns the value of k, or nil if it does not exist. The value is
// valid for the life of the transaction and must not be modified.
func (b bucket) Get(k []byte) []byte {
	for _, l := range [2]*layer{b.t.active, b.t.frozen} {
		if l == nil {
			continue
		}
		if n := l.get(b.id, k); n != nil {
			if n.del {
				return nil
			}
			return n.val
		}
	}
	return b.b.Get(k)
}

// Put sets k to v. The store keeps k and v from then on: the caller must
// not modify them.
func (b bucket) Put(k, v []byte) error {
	if v == nil {
		v = []byte{} // an empty value exists; only a tombstone reads as nil
	}
	return b.t.set(b.id, k, v, false)
}

// Delete removes k; deleting a key that does not exist is not an error.
func (b bucket) Delete(k []byte) error { return b.t.set(b.id, k, nil, true) }

// Cursor returns a cursor over the bucket's keys as the view sees them.
func (b bucket) Cursor() *cursor {
	c := &cursor{bc: b.b.Cursor()}
	c.roots[0] = b.t.active.roots[b.id]
	if b.t.frozen != nil {
		c.roots[1] = b.t.frozen.roots[b.id]
	}
	return c
}

// cursor merges a bbolt cursor with the overlay's trees of one bucket: keys
// in order, each with the value of the highest layer that holds it, keys
// deleted in the overlay left out.
type cursor struct {
	bc     *bolt.Cursor
	bk, bv []byte
	roots  [2]*node    // active, frozen: the first wins
	iters  [2]treeIter // over roots
	key    []byte      // current key, nil past the end
}

// Seek moves to the first key at or after k and returns it with its value,
// or nil past the end.
func (c *cursor) Seek(k []byte) (key, value []byte) {
	c.bk, c.bv = c.bc.Seek(k)
	for i := range c.iters {
		c.iters[i].seek(c.roots[i], k)
	}
	return c.settle()
}

// Next moves to the following key.
func (c *cursor) Next() (key, value []byte) {
	if c.key == nil {
		return nil, nil
	}
	c.skip(c.key)
	return c.settle()
}

// skip moves every source that is at k past it.
func (c *cursor) skip(k []byte) {
	if c.bk != nil && bytes.Equal(c.bk, k) {
		c.bk, c.bv = c.bc.Next()
	}
	for i := range c.iters {
		if n := c.iters[i].node(); n != nil && bytes.Equal(n.key, k) {
			c.iters[i].next()
		}
	}
}

// settle makes the smallest key of all sources current, unless a layer
// deletes it, in which case it moves on.
func (c *cursor) settle() (key, value []byte) {
	for {
		k, v, del := c.bk, c.bv, false
		// Lowest precedence first, so that on equal keys the higher layer
		// overrides.
		for i := len(c.iters) - 1; i >= 0; i-- {
			n := c.iters[i].node()
			if n != nil && (k == nil || bytes.Compare(n.key, k) <= 0) {
				k, v, del = n.key, n.val, n.del
			}
		}
		c.key = k
		if k == nil || !del {
			return k, v
		}
		c.skip(k)
	}
}
