package rebuild

import (
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// Builder turns batches of items into the Redis commands that rebuild the
// key it owns. Package builders provides builders for hashes, sorted sets,
// sets and one-set-per-value indexes; implement Builder for any other type.
//
// Builders are pure: Build never does I/O. It appends commands to c, which
// the Rebuilder sends, and addresses them to this run's temp keys, which it
// gets from [Commands.Temp]. Build is called once per batch, concurrently
// for different batches, so it must not modify shared state without
// synchronisation.
type Builder[T any] interface {
	// Key returns the live key the builder rebuilds or, for a [Family]
	// builder, the prefix of the family of keys it rebuilds.
	Key() string
	// Build appends to c the commands that write items.
	Build(c *Commands, items []T) error
}

// Family is an optional interface for a [Builder] that rebuilds a family of
// keys "<prefix>:<bucket>" rather than one key, such as builders.SetIndex.
// Its Key method returns the prefix.
//
// The family owns every key of its KeyType under "<prefix>:". The Rebuilder
// locks the prefix, publishes every bucket the run produced, and in the same
// atomic step deletes the live buckets it did not produce (found by SCAN
// before the publish), so that a value no longer in the source disappears
// from the index.
type Family interface {
	// KeyType returns the Redis type of the family's keys, as the TYPE
	// command names it ("set" for SetIndex). Keys of other types under the
	// prefix are never deleted as orphans.
	KeyType() string
}

// Commutative is an optional interface for a [Builder] whose writes give
// the same result in whatever order its batches reach Redis, as SADD's do:
// builders.Set and builders.SetIndex implement it. When every builder of a
// Rebuilder is commutative, the Rebuilder overlaps its round trips as if
// [Options.Unordered] were set, and the result is the same as in order.
//
// A builder whose batches can write one entry twice with different values
// (HSET of a field, ZADD of a member) is not commutative: which value wins
// depends on the order.
type Commutative interface {
	// Commutative reports whether the builder's writes commute.
	Commutative() bool
}

// Keyed is an optional interface for a [Builder] that is not [Commutative]
// but whose batches can disagree only on an entry both of them write, as
// HSET's fields and ZADD's members do: builders.Hash and builders.SortedSet
// implement it. Its Build reports every entry it writes with
// [Commands.Writes].
//
// When every builder of a Rebuilder is Commutative or Keyed, the Rebuilder
// overlaps two round trips whenever they write no entry in common, and
// sends the later one only after the earlier has returned when they do, so
// the last write in source order still wins (C50, C54).
type Keyed interface {
	// Keyed reports whether Build reports every entry it writes.
	Keyed() bool
}

// Commands collects the commands one batch sends. A Builder receives it in
// Build.
type Commands struct {
	cb      rueidis.Builder
	targets *targets
	builder int // index of the builder now building
	cmds    rueidis.Commands
	entries []int64            // entries written, per builder
	touched []*target          // temp keys this batch writes, in order
	err     error              // the first argument over maxBulk
	seen    map[*target]bool   // set of touched
	temps   map[string]*target // this batch's cache of targets.get
	writes  [][]uint64         // hashes of the entries written, per builder (Keyed builders); sorted once built
}

// entrySeed seeds the hashes of the entries that Keyed builders write.
var entrySeed = maphash.MakeSeed()

// Writes records that the builder now building writes entry (a hash field,
// a sorted-set member) in this batch. A [Keyed] builder calls it for every
// entry it writes; for a family, an entry of any of its keys. Two batches
// that write a common entry of one builder are sent in order.
func (c *Commands) Writes(entry string) {
	if c.writes == nil {
		c.writes = make([][]uint64, len(c.entries))
	}
	c.writes[c.builder] = append(c.writes[c.builder], maphash.String(entrySeed, entry))
}

// sortWrites sorts the recorded entry hashes, for conflicts. The batch's
// goroutine calls it once every builder has built.
func (c *Commands) sortWrites() {
	for _, w := range c.writes {
		slices.Sort(w)
	}
}

// conflicts reports whether c and o write a common entry of one builder. A
// collision of two entries' 64-bit hashes reports a conflict too, which
// only costs an overlap.
func (c *Commands) conflicts(o *Commands) bool {
	if c.writes == nil || o.writes == nil {
		return false
	}
	for i, a := range c.writes {
		b := o.writes[i]
		for len(a) > 0 && len(b) > 0 {
			switch {
			case a[0] < b[0]:
				a = a[1:]
			case a[0] > b[0]:
				b = b[1:]
			default:
				return true
			}
		}
	}
	return false
}

// B returns the command builder for the commands passed to [Commands.Add].
func (c *Commands) B() rueidis.Builder { return c.cb }

// Temp returns this run's temp key for the live key live, which must be the
// builder's own key or, for a [Family] builder, a key "<prefix>:<bucket>"
// with a non-empty bucket. Any other key is an error, and the rebuild fails
// without publishing anything.
//
// Commands passed to Add must write only to keys returned by Temp.
func (c *Commands) Temp(live string) (string, error) {
	t := c.temps[live]
	if t == nil || t.builder != c.builder {
		var err error
		if t, err = c.targets.get(c.builder, live); err != nil {
			return "", err
		}
		c.temps[live] = t
	}
	if !c.seen[t] {
		c.seen[t] = true
		c.touched = append(c.touched, t)
	}
	return t.temp, nil
}

// Add appends cmd, which writes entries index entries (fields, members), to
// the batch. The entry count feeds [Stats].Targets. A command with an
// argument over Redis's 512 MB limit fails the rebuild before anything of
// the batch is sent.
func (c *Commands) Add(cmd rueidis.Completed, entries int) {
	for _, a := range cmd.Commands() {
		if len(a) > maxBulk && c.err == nil {
			args := cmd.Commands()
			c.err = fmt.Errorf("%s on %q has an argument of %d bytes, over the 512 MB Redis accepts (proto-max-bulk-len)", args[0], args[min(1, len(args)-1)], len(a))
		}
	}
	c.cmds = append(c.cmds, cmd)
	c.entries[c.builder] += int64(entries)
}

// maxBulk is Redis's default proto-max-bulk-len: the largest argument a
// command may carry.
const maxBulk = 512 << 20

// target is one live key of a run and its temp key.
type target struct {
	final, temp string
	builder     int
	// populated records that temp was created: a batch's EXPIRE NX or a
	// renewal found it without a TTL. A second creation means it was lost
	// and re-created by a later write.
	populated atomic.Bool
}

// created records that temp was found created (without a TTL). It reports
// false when temp had been created before: it was lost and re-created, and
// holds only part of the rebuild.
func (t *target) created() bool { return t.populated.CompareAndSwap(false, true) }

// owner is what the targets registry knows of one builder.
type owner struct {
	key    string
	family bool
}

// targets maps the live keys of a run to their temp keys. Keys of plain
// builders are registered when the run starts; family buckets when a batch
// first writes them.
type targets struct {
	newTemp func(live string) string
	owners  []owner
	cluster bool
	slot    uint16

	mu      sync.Mutex
	byKey   map[string]*target
	ordered []*target
}

func newTargets(owners []owner, cluster bool, newTemp func(string) string) *targets {
	ts := &targets{newTemp: newTemp, owners: owners, cluster: cluster, byKey: map[string]*target{}}
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
// that builder b owns live.
func (ts *targets) get(b int, live string) (*target, error) {
	o := ts.owners[b]
	switch {
	case !o.family && live != o.key:
		return nil, fmt.Errorf("builder %q wrote to key %q, which it does not own", o.key, live)
	case o.family && (!strings.HasPrefix(live, o.key+":") || len(live) == len(o.key)+1):
		return nil, fmt.Errorf("family builder %q wrote to key %q, which is not %q followed by a bucket", o.key, live, o.key+":")
	case reserved(live):
		return nil, fmt.Errorf("builder %q wrote to key %q, which has the shape of a rebuild lock or temp key; keyswap would take it for one (a lock key collision would block every later rebuild), so such keys cannot be rebuilt", o.key, live)
	case ts.cluster && keys.Slot(live) != ts.slot:
		return nil, fmt.Errorf("builder %q wrote to key %q in hash slot %d, outside this rebuild's slot %d; give it the rebuild's hash tag", o.key, live, keys.Slot(live), ts.slot)
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.byKey[live]
	if t == nil {
		t = &target{final: live, temp: ts.newTemp(live), builder: b}
		ts.byKey[live] = t
		ts.ordered = append(ts.ordered, t)
	}
	return t, nil
}

// reserved reports whether key has the shape of a rebuild lock or temp key.
func reserved(key string) bool {
	_, _, temp := keys.ParseTempKey(key)
	return temp || strings.HasSuffix(key, keys.LockSuffix) || strings.HasSuffix(key, keys.LockSuffix+keys.ReceiptSuffix)
}

// all returns every target so far.
func (ts *targets) all() []*target {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return append([]*target(nil), ts.ordered...)
}

// has reports whether live is a target of the run.
func (ts *targets) has(live string) bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.byKey[live] != nil
}
