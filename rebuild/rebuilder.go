package rebuild

import (
	"fmt"
	"strings"
	"time"

	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/redis/rueidis"
)

// Rebuilder rebuilds the keys of its builders from one pass over a source,
// and publishes them all at once. It is safe for concurrent use; runs of
// the same keys exclude each other through their locks.
type Rebuilder[T any] struct {
	core
	builders []index.Builder[T]
}

// core is what a Rebuilder knows that does not depend on the items' type:
// everything a run needs after its batches are built.
type core struct {
	redis    *protocol.Redis
	opts     Options
	owners   []owner
	lives    []string // the builders' keys: the keys locked
	lockKeys []string // their locks
	key      string   // the builders' keys, for errors
	ttlSecs  int64    // the lease, in seconds
	tempSecs int64    // the temp keys' TTL, in seconds: twice the lease
	order    order
	specs    keySpecs // where the keys are in the commands builders add
}

// order is how many round trips a run keeps in flight, and when.
type order int8

const (
	// inOrder: one round trip at a time, so batches run in source order.
	inOrder order = iota
	// byEntry: two at a time, unless they write a common entry of a
	// ByEntry builder; every builder is ByEntry or AnyOrder.
	byEntry
	// anyOrder: two at a time, whatever they write: Unordered, or every
	// builder is AnyOrder.
	anyOrder
)

// New returns a Rebuilder that writes through client with builders. It
// returns an *Error of Op "config", sent nothing, for invalid options or
// builders: a negative BatchSize, no builders, an empty or duplicated key, a
// key inside another builder's family, a key with the shape of keyswap's own
// keys, or, on a cluster, keys in different hash slots.
//
// New panics if client or a builder is nil: those are programming errors.
func New[T any](client rueidis.Client, opts Options, builders ...index.Builder[T]) (*Rebuilder[T], error) {
	if client == nil {
		panic("keyswap: rebuild.New: nil rueidis.Client")
	}
	for i, b := range builders {
		if b == nil {
			panic(fmt.Sprintf("keyswap: rebuild.New: builder %d is nil", i))
		}
	}
	r := &Rebuilder[T]{core: core{redis: protocol.NewInGroup(client, opts.Group, opts.Logger), opts: opts}, builders: builders}
	r.opts.Logger = r.redis.Logger()
	if err := r.configure(); err != nil {
		return nil, err
	}
	return r, nil
}

// configure fills in defaults and validates the options and builders.
func (r *Rebuilder[T]) configure() error {
	o := &r.opts
	r.addOwners()
	bad := func(format string, args ...any) error {
		return &Error{Op: "config", Key: r.key, Err: fmt.Errorf(format, args...)}
	}
	if err := r.checkCounts(bad); err != nil {
		return err
	}
	o.Grace = protocol.OrDefault(o.Grace, defaultGrace)
	if err := r.checkOrders(bad); err != nil {
		return err
	}
	o.BatchSize = protocol.OrDefault(o.BatchSize, defaultBatchSize)
	o.Writers = protocol.OrDefault(o.Writers, defaultWriters)
	o.TTL = protocol.OrDefault(o.TTL, defaultTTL)
	o.PreserveFor = protocol.OrDefault(o.PreserveFor, defaultPreserveFor)
	for what, d := range map[string]time.Duration{"TTL": o.TTL, "PreserveFor": o.PreserveFor} {
		if d < time.Second || d%time.Second != 0 {
			return bad("%s %v: must be a whole number of seconds, at least 1s (Redis expiries here are in seconds)", what, d)
		}
	}
	r.ttlSecs = int64(o.TTL / time.Second)
	r.tempSecs = 2 * r.ttlSecs
	if err := r.checkTimes(bad); err != nil {
		return err
	}
	if err := r.validateKeys(bad); err != nil {
		return err
	}
	for _, o := range r.owners {
		r.lives = append(r.lives, o.key)
		r.lockKeys = append(r.lockKeys, r.redis.LockKey(o.key))
	}
	if r.redis.Cluster() {
		return r.checkSlots(bad)
	}
	return nil
}

// checkCounts checks the options that are counts or the lease, the
// builders' number and the publish mode.
func (r *Rebuilder[T]) checkCounts(bad func(string, ...any) error) error {
	o := &r.opts
	switch {
	case o.BatchSize < 0:
		return bad("BatchSize %d: must not be negative (zero means %d)", o.BatchSize, defaultBatchSize)
	case o.Writers < 0:
		return bad("Writers %d: must not be negative (zero means %d)", o.Writers, defaultWriters)
	case o.TTL < 0:
		return bad("TTL %v: must not be negative (zero means %v)", o.TTL, defaultTTL)
	case o.PreserveFor < 0:
		return bad("PreserveFor %v: must not be negative (zero means %v)", o.PreserveFor, defaultPreserveFor)
	case len(r.builders) == 0:
		return bad("no builders")
	case o.Publish != RenameInPlace && o.Publish != Generations:
		return bad("Publish %v: must be RenameInPlace or Generations", o.Publish)
	case o.SkipSizeCheck && o.Publish != Generations:
		return bad("SkipSizeCheck in %v mode: only Generations mode checks sizes (a RenameInPlace publish RENAMEs each temp key, which fails for a lost one); drop SkipSizeCheck, or use Generations", o.Publish)
	}
	return checkGroup(o, bad)
}

// addOwners sets what a run knows of each builder, the run's order, and
// the key of errors.
func (r *Rebuilder[T]) addOwners() {
	var ks []string
	r.order = anyOrder
	for _, b := range r.builders {
		r.order = min(r.order, orderOf(b))
		f, family := b.(index.Family)
		_, incremental := b.(index.Incremental[T])
		o := owner{key: b.Key(), family: family, commutative: orderOf(b) == anyOrder, unique: orderOf(b) == anyOrder && incremental, incremental: incremental}
		if family {
			o.keyType = f.KeyType()
		}
		r.owners = append(r.owners, o)
		ks = append(ks, b.Key())
	}
	if r.opts.Unordered {
		r.order = anyOrder
	}
	r.key = strings.Join(ks, ", ")
}

// checkOrders refuses a builder whose Order is none of index's.
func (r *Rebuilder[T]) checkOrders(bad func(string, ...any) error) error {
	for i, b := range r.builders {
		if o, ok := b.(index.Ordered); ok && o.Order() != index.InOrder && o.Order() != index.ByEntry && o.Order() != index.AnyOrder {
			return bad("builder %d (%q): Order returned %v, which is none of InOrder, ByEntry and AnyOrder", i, b.Key(), o.Order())
		}
	}
	return nil
}

// checkTimes fills in and checks the options that are durations or rates.
func (r *Rebuilder[T]) checkTimes(bad func(string, ...any) error) error {
	o := &r.opts
	switch {
	case o.StallTimeout < 0:
		return bad("StallTimeout %v: must not be negative (zero means %v)", o.StallTimeout, defaultStallTimeout)
	case o.FlushInterval < 0:
		return bad("FlushInterval %v: must not be negative (zero means %v)", o.FlushInterval, defaultFlushInterval)
	case o.MaxRate < 0 || o.MaxRate != o.MaxRate:
		return bad("MaxRate %v: must be a positive number of items per second, or zero for no limit", o.MaxRate)
	case o.LatencyBudget < 0:
		return bad("LatencyBudget %v: must not be negative (zero means no budget)", o.LatencyBudget)
	case o.Expected < 0:
		return bad("Expected %d: must not be negative (zero means unknown)", o.Expected)
	}
	switch {
	case o.MaxMerged < 0:
		return bad("MaxMerged %d: must not be negative (zero means %d)", o.MaxMerged, defaultMaxMerged)
	case o.MaxChanges < 0:
		return bad("MaxChanges %d: must not be negative (zero means %d)", o.MaxChanges, defaultMaxChanges)
	case o.KeepPrevious < 0 || o.KeepPrevious%time.Second != 0:
		return bad("KeepPrevious %v: must be a whole number of seconds, or zero to keep nothing", o.KeepPrevious)
	case o.CatchUpTimeout < 0:
		return bad("CatchUpTimeout %v: must not be negative (zero means %v)", o.CatchUpTimeout, defaultCatchUpTimeout)
	case o.MaxHold < 0:
		return bad("MaxHold %v: must not be negative (zero means %v)", o.MaxHold, defaultMaxHold)
	}
	o.MaxHold = protocol.OrDefault(o.MaxHold, defaultMaxHold)
	o.MaxMerged = protocol.OrDefault(o.MaxMerged, defaultMaxMerged)
	o.MaxChanges = protocol.OrDefault(o.MaxChanges, defaultMaxChanges)
	o.MaxKeys = protocol.OrDefault(o.MaxKeys, defaultMaxKeys)
	o.CatchUpTimeout = protocol.OrDefault(o.CatchUpTimeout, defaultCatchUpTimeout)
	o.StallTimeout = protocol.OrDefault(o.StallTimeout, defaultStallTimeout)
	o.FlushInterval = protocol.OrDefault(o.FlushInterval, defaultFlushInterval)
	return r.checkDurability(bad)
}

// validateKeys refuses empty, reserved, duplicated and nested keys.
func (r *Rebuilder[T]) validateKeys(bad func(string, ...any) error) error {
	for i, a := range r.owners {
		if a.key == "" {
			return bad("builder %d (%T) has an empty key", i, r.builders[i])
		}
		if keys.Reserved(a.key) {
			return bad("key %q of builder %d has the shape of a rebuild lock or temp key, so it cannot be rebuilt", a.key, i)
		}
		for j, b := range r.owners[:i] {
			switch {
			case a.key == b.key:
				return bad("builders %d and %d both target key %q", j, i, a.key)
			case b.family && strings.HasPrefix(a.key, b.key+":"):
				return bad("key %q of builder %d is inside the family %q of builder %d, whose publish would delete it", a.key, i, b.key+":*", j)
			case a.family && strings.HasPrefix(b.key, a.key+":"):
				return bad("key %q of builder %d is inside the family %q of builder %d, whose publish would delete it", b.key, j, a.key+":*", i)
			}
		}
	}
	return nil
}

// checkSlots refuses, on a cluster, builders whose keys cannot be published
// in one single-slot script: in RenameInPlace mode, their keys; in
// Generations mode, their locks, records, pointers and registries, all in
// the slots of the builders' keys.
func (r *Rebuilder[T]) checkSlots(bad func(string, ...any) error) error {
	for _, o := range r.owners {
		if r.opts.Publish == Generations {
			// A family's keys may spread: the flip touches only the
			// pointers, registries and metas, in the locks' slot.
			break
		}
		if _, tagged := keys.HashTag(o.key); o.family && !tagged {
			return bad("family prefix %q has no hash tag, so on Redis Cluster its buckets would spread over many hash slots and could not be published atomically; put the part that must stay together in braces, e.g. %q",
				o.key, "{"+o.key+"}")
		}
	}
	if r.opts.Group != "" {
		// Every control key hangs off the group's tag.
		return nil
	}
	first := r.owners[0].key
	for _, o := range r.owners[1:] {
		if keys.Slot(o.key) != keys.Slot(first) {
			return bad("keys %q (slot %d) and %q (slot %d) are in different hash slots, and one publish must stay in one slot on Redis Cluster; give them a common hash tag, e.g. %q and %q",
				first, keys.Slot(first), o.key, keys.Slot(o.key), "{idx}:"+first, "{idx}:"+o.key)
		}
	}
	return nil
}

// orderOf returns b's index.Order as the run's order: inOrder for a
// builder that is not index.Ordered (configure refuses an Order it does not
// know).
func orderOf(b any) order {
	o, _ := b.(index.Ordered)
	if o == nil {
		return inOrder
	}
	switch o.Order() {
	case index.AnyOrder:
		return anyOrder
	case index.ByEntry:
		return byEntry
	}
	return inOrder
}
