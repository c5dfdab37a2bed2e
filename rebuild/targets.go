package rebuild

import (
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
)

// target is one live key of a run and its temp key.
type target struct {
	protocol.Temp
	builder int
	bucket  string // a family's bucket: Live after the prefix and colon

	// buf holds the key's merged entries while they wait in the coalescer,
	// nil when none wait: a family of a million buckets then keeps no
	// buffer per bucket between commands. Only the sender touches it.
	buf  *mergeBuf
	held bool   // in the coalescer's list of targets with entries
	slot uint16 // the hash slot of Key, computed once

	// In Generations mode, what the writes did to the key (see
	// sizeCheck): the kind of the additive commands that wrote it, the
	// entries their replies reported new, and whether another command
	// wrote it too, which leaves it unchecked.
	sizeKind  atomic.Uint32
	added     atomic.Int64
	uncounted atomic.Bool
	// listed is set, in Generations mode, once a transaction carries the
	// key to its generation's manifest list (see writer.listing). Beside
	// uncounted, it takes no room of its own.
	listed atomic.Bool
}

// owner is what the targets registry knows of one builder.
type owner struct {
	key         string
	family      bool
	commutative bool
	// unique: the builder is AnyOrder and Incremental, as builders.Set
	// and builders.SetIndex are, so each member of its keys must belong to
	// one item: Apply removes an item's member when the item moves, which
	// would remove it for another item that shares it. A merged SADD that
	// adds fewer members than it sends fails the run.
	unique bool
	// incremental: the builder is Incremental, so its log of changes may
	// hold ops the catch-up and the publish replay.
	incremental bool
	// keyType is a family's key type (index.Family.KeyType), "" for a
	// plain builder.
	keyType string
}

// targets maps the live keys of a run to their temp keys. Keys of plain
// builders are registered when the run starts; family buckets when a batch
// first writes them.
type targets struct {
	newTemp func(live string) string
	owners  []owner
	max     int // Options.MaxKeys; 0: no limit
	cluster bool
	slot    uint16

	// buckets[b] maps a family builder b's bucket names to their targets,
	// for Commands.MergeBucket: found without building the key.
	buckets []bucketIndex

	// byKey maps the keys of plain builders to their targets: written by
	// newTargets only (see find).
	byKey map[string]*target

	mu      sync.Mutex // creations of targets; ordered; refused
	ordered []*target
	refused map[string]bool // reserved keys a builder asked for, logged once each
	log     func(live string)
}

func newTargets(owners []owner, cluster bool, newTemp func(string) string) *targets {
	ts := &targets{newTemp: newTemp, owners: owners, cluster: cluster, byKey: map[string]*target{}, buckets: make([]bucketIndex, len(owners))}
	if cluster {
		ts.slot = keys.Slot(owners[0].key)
	}
	for i, o := range owners {
		if !o.family {
			// Registered up front, so that a source without items for it
			// still publishes it: as an empty rebuild that deletes the key.
			if _, err := ts.get(i, o.key); err != nil {
				panic("keyswap: registering " + o.key + ": " + err.Error()) // validated by New
			}
		}
	}
	return ts
}

// get returns the target for live, creating it on first use, after checking
// that builder b owns live. A key seen before is found without a lock: a
// family of many buckets asks for each of them in every batch.
func (ts *targets) get(b int, live string) (*target, error) {
	if t := ts.find(b, live); t != nil {
		return t, nil
	}
	if err := ts.owners[b].owns(live, ts.cluster, ts.slot); err != nil {
		return nil, err
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	// Again, under the lock that creations take: another goroutine may have
	// created it since.
	if t := ts.find(b, live); t != nil {
		return t, nil
	}
	if ts.max > 0 && len(ts.ordered) >= ts.max {
		return nil, tooManyKeys(ts.max, "the run writes more keys than that")
	}
	t := &target{Temp: protocol.Temp{Live: live, Key: ts.newTemp(live)}, builder: b}
	t.slot = keys.Slot(t.Key)
	if o := ts.owners[b]; o.family {
		t.bucket = live[len(o.key)+1:]
		ts.buckets[b].add(t)
	} else {
		ts.byKey[live] = t
	}
	ts.ordered = append(ts.ordered, t)
	return t, nil
}

// find returns builder b's target for live, or nil if it has none yet. A
// family's buckets are found in its bucketIndex only, and the keys of
// plain builders in byKey, which is written only by newTargets (a plain
// builder owns one key, registered up front) and so is read without a
// lock: one map entry per bucket, not two, for a family of a million.
func (ts *targets) find(b int, live string) *target {
	if o := ts.owners[b]; o.family {
		if !isBucket(live, o.key) {
			return nil
		}
		return ts.buckets[b].find(live[len(o.key)+1:])
	}
	// Another plain builder's key is not b's: get then refuses it.
	if t := ts.byKey[live]; t != nil && t.builder == b {
		return t
	}
	return nil
}

// lookup returns the target of live, whichever builder's it is, or nil.
func (ts *targets) lookup(live string) *target {
	for b := range ts.owners {
		if t := ts.find(b, live); t != nil {
			return t
		}
	}
	return nil
}

// bucket returns the target of family builder b's bucket, the key
// "<prefix>:<bucket>", as get does.
func (ts *targets) bucket(b int, bucket string) (*target, error) {
	if t := ts.buckets[b].find(bucket); t != nil {
		return t, nil
	}
	return ts.get(b, ts.owners[b].key+":"+bucket)
}

// bucketIndex maps a family's bucket names to their targets. Every item of
// a SetIndex looks its bucket up, from each build goroutine at once, and
// buckets are added only when a batch first writes them: so a lookup reads
// an immutable map through an atomic pointer, and once every bucket is in
// it, lookups write nothing that the goroutines share (a read lock's
// counter, written by every lookup, moved between the cores and cost as
// much as the lookup). Buckets added since the map was made wait in added,
// under mu; once added has answered as many lookups as the map has
// entries, a new map with every bucket replaces it. A copy then costs no
// more than the lookups that went to added and the additions since the
// last copy: a constant per lookup, over a run. Each bucket name is its
// target's, not the caller's.
type bucketIndex struct {
	read atomic.Pointer[map[string]*target]

	mu     sync.Mutex
	added  map[string]*target // buckets not in read
	misses int                // lookups that read missed and added answered, since read was made
}

// find returns the target of bucket, or nil if it has none yet.
func (ix *bucketIndex) find(bucket string) *target {
	if t := lookup(ix.read.Load(), bucket); t != nil {
		return t
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	// Read again: another lookup may have promoted the bucket from added
	// since the first read.
	m := ix.read.Load()
	if t := lookup(m, bucket); t != nil {
		return t
	}
	t := ix.added[bucket]
	if t == nil {
		return nil
	}
	// A miss of read that added answers: read is behind.
	ix.misses++
	if m == nil || ix.misses >= len(*m) {
		ix.promote()
	}
	return t
}

// lookup returns bucket's target in m, or nil; m may be nil.
func lookup(m *map[string]*target, bucket string) *target {
	if m == nil {
		return nil
	}
	return (*m)[bucket]
}

// add adds t, a bucket's new target.
func (ix *bucketIndex) add(t *target) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.added == nil {
		ix.added = map[string]*target{}
	}
	ix.added[t.bucket] = t
}

// promote replaces read with a map of every bucket. Its caller holds mu.
func (ix *bucketIndex) promote() {
	var m map[string]*target
	if old := ix.read.Load(); old != nil {
		m = maps.Clone(*old)
		maps.Copy(m, ix.added)
	} else {
		m = ix.added
	}
	ix.read.Store(&m)
	ix.added, ix.misses = nil, 0
}

// tooManyKeys reports a run over Options.MaxKeys.
func tooManyKeys(max int, why string) error {
	return fmt.Errorf("%w: a publish may touch at most %d keys (Options.MaxKeys), and %s; the publish is one atomic script that blocks Redis for about 10 µs per key", ErrTooManyKeys, max, why)
}

// owns returns nil if o's builder may write live: its own key, or, for a
// family, a bucket below its prefix; on a cluster, in slot.
func (o owner) owns(live string, cluster bool, slot uint16) error {
	switch {
	case !o.family && live != o.key:
		return fmt.Errorf("builder %q wrote to key %q, which it does not own", o.key, live)
	case o.family && !isBucket(live, o.key):
		return fmt.Errorf("family builder %q wrote to key %q, which is not %q followed by a bucket", o.key, live, o.key+":")
	case keys.Reserved(live):
		return fmt.Errorf("%w: builder %q wrote to key %q, which has the shape of a key keyswap keeps next to an index (a lock, a record, a temp key, ...); keyswap would take it for one of its own (a lock key collision would block every later rebuild), so such keys cannot be rebuilt", index.ErrReservedKey, o.key, live)
	case cluster && keys.Slot(live) != slot:
		return fmt.Errorf("builder %q wrote to key %q in hash slot %d, outside this rebuild's slot %d; give it the rebuild's hash tag", o.key, live, keys.Slot(live), slot)
	}
	return nil
}

// isBucket reports whether live is "<prefix>:<bucket>" with a non-empty
// bucket.
func isBucket(live, prefix string) bool {
	return len(live) > len(prefix)+1 && live[len(prefix)] == ':' && live[:len(prefix)] == prefix
}

// skipped logs, once per key, that a builder asked for live, a reserved
// key, and skipped its entry.
func (ts *targets) skipped(live string) {
	ts.mu.Lock()
	first := !ts.refused[live]
	if first {
		if ts.refused == nil {
			ts.refused = map[string]bool{}
		}
		ts.refused[live] = true
	}
	ts.mu.Unlock()
	if first && ts.log != nil {
		ts.log(live)
	}
}

// all returns every target so far.
func (ts *targets) all() []*target {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return append([]*target(nil), ts.ordered...)
}

// temps returns the protocol.Temp of every target so far.
func (ts *targets) temps() []*protocol.Temp {
	all := ts.all()
	out := make([]*protocol.Temp, len(all))
	for i, t := range all {
		out[i] = &t.Temp
	}
	return out
}

// has reports whether live is a target of the run.
func (ts *targets) has(live string) bool { return ts.lookup(live) != nil }
