package index

import (
	"errors"
	"strconv"

	"github.com/keyswap/keyswap/internal/hook"
	"github.com/redis/rueidis"
)

// Builder turns batches of items into the Redis commands that rebuild the
// key it owns. Package builders provides builders for hashes, sorted sets,
// sets and one-set-per-value indexes; implement Builder for any other type.
//
// Builders are pure: Build never does I/O. It appends commands to c, which
// the runner sends, and addresses them to this run's temp keys, which it
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
// The family owns every key of its KeyType under "<prefix>:". The runner
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

// Order is what the runner may do with the order of a builder's batches.
// Each batch is one round trip's worth of commands; the runner keeps a
// second round trip in flight only when every builder's Order allows it.
type Order int8

const (
	// InOrder: batches reach Redis one round trip at a time, in source
	// order, so that the last write of an entry in the source wins. It is
	// the order of a builder that does not implement [Ordered], and the
	// safe choice for any builder.
	InOrder Order = iota
	// ByEntry: two batches may reach Redis in either order unless they
	// write a common entry (a hash field, a sorted-set member), as HSET's
	// and ZADD's batches may: then the later waits for the earlier. The
	// builder reports every entry it writes with [Commands.Entry].
	// builders.Hash and builders.SortedSet are ByEntry.
	ByEntry
	// AnyOrder: the builder's writes give the same result in whatever order
	// and grouping they reach Redis, as SADD's do, so batches may reach it
	// in any order, and the builder may merge its writes with
	// [Commands.Merge]. A builder whose batches can write one entry twice
	// with different values (HSET of a field, ZADD of a member) is not
	// AnyOrder. builders.Set and builders.SetIndex are AnyOrder.
	AnyOrder
)

// String returns the constant's name.
func (o Order) String() string {
	switch o {
	case InOrder:
		return "InOrder"
	case ByEntry:
		return "ByEntry"
	case AnyOrder:
		return "AnyOrder"
	}
	return "Order(" + strconv.Itoa(int(o)) + ")"
}

// Ordered is an optional interface for a [Builder] whose batches may reach
// Redis in another order than the source's. See package rebuild's
// documentation, "Pipeline", for what the runner makes of it.
type Ordered interface {
	// Order returns what the runner may do with the order of the
	// builder's batches: InOrder, ByEntry or AnyOrder (the Rebuilder's
	// New refuses any other value).
	Order() Order
}

// MaxArgs is the most entries (fields, members) one command carries, from a
// builder or from the runner's merging of [Commands.Merge] calls. Past
// about 1000, bigger commands no longer make the server faster per entry,
// and they make each command block it for longer.
const MaxArgs = 1000

// ErrReservedKey is what [Commands.Temp] returns for a family bucket whose
// key has the shape of keyswap's own keys (a lock, a record, a temp key),
// and what [Writes] methods return for such a key: skip the entry, and the
// run goes on.
var ErrReservedKey = errors.New("the key has the shape of keyswap's own keys")

// Commands collects the commands one batch sends. A Builder receives it in
// Build; only the runner makes one.
type Commands struct {
	c hook.Commands
	// args holds the entries of a Merge while the runner reads them, so
	// that the variadic slice of the caller, which the runner only copies,
	// stays on the caller's stack: an item-by-item Merge allocates
	// nothing for it.
	args []string
}

// B returns the command builder for the commands passed to [Commands.Add].
func (c *Commands) B() rueidis.Builder { return c.c.B() }

// Temp returns this run's temp key for the live key live, which must be the
// builder's own key or, for a [Family] builder, a key "<prefix>:<bucket>"
// with a non-empty bucket. Any other key is an error, and the rebuild fails
// without publishing anything.
//
// For a family bucket whose key has the shape of keyswap's own keys (a
// bucket named "rebuild-lock", say), Temp returns an error matching
// [ErrReservedKey]: skip the entry, and the run goes on. Each such call
// counts one skipped entry in the run's Stats.Skipped.
//
// Commands passed to Add must write only to keys returned by Temp.
func (c *Commands) Temp(live string) (string, error) { return c.c.Temp(live) }

// Entry records that the builder now building writes entry (a hash field,
// a sorted-set member) in this batch. A [ByEntry] builder calls it for
// every entry it writes; for a family, an entry of any of its keys. Two
// batches that write a common entry of one builder are sent in order.
func (c *Commands) Entry(entry string) { c.c.Entry(entry) }

// Merge adds entries of a command (such as SADD) on the temp key of the
// live key live, which Temp would return: command name, that key, then the
// entries, one argument each. The runner may merge them with the same
// command on the same key from other batches, and send them later, in
// commands of up to [MaxArgs] entries: a family's buckets then get full
// commands although each batch spreads over all of them.
//
// Only an [AnyOrder] builder may call Merge, for a command whose writes
// give the same result in any order and any grouping (SADD, PFADD), whose
// only key is its first argument; the run fails otherwise. Its errors are
// Temp's. An entry over Redis's 512 MB limit (proto-max-bulk-len) fails
// the rebuild before anything of the batch is sent, as [Commands.Add]'s
// arguments do. Each entry counts in the run's Stats.Entries; a Merge of
// no entries writes nothing, not even the key.
func (c *Commands) Merge(live, name string, entries ...string) error {
	c.args = append(c.args[:0], entries...)
	return c.c.Merge(live, name, c.args...)
}

// MergeBucket is [Commands.Merge] on the bucket "<prefix>:<bucket>" of a
// [Family] builder, whose Key is prefix, without building that key: the
// bucket's temp key is found with one lookup of its name, shared by every
// batch. It is the cheap way to merge a family's entries one item at a
// time, as SetIndex does; its errors are Merge's, and calling it from a
// builder that is not a Family fails the run.
func (c *Commands) MergeBucket(bucket, name string, entries ...string) error {
	c.args = append(c.args[:0], entries...)
	return c.c.MergeBucket(bucket, name, c.args...)
}

// Add appends cmd, which writes entries index entries (fields, members), to
// the batch. The entry count feeds the run's Stats.Entries. A command with
// an argument over Redis's 512 MB limit, or one whose keys are not all temp
// keys the builder got from Temp in this batch, fails the rebuild before
// anything of the batch is sent. (The runner finds a command's keys with
// COMMAND INFO, once per command name, or COMMAND GETKEYS for a command
// whose keys move with its arguments.)
func (c *Commands) Add(cmd rueidis.Completed, entries int) { c.c.Add(cmd, entries) }

func init() {
	hook.NewCommands = func(c hook.Commands) any { return &Commands{c: c} }
	hook.NewWrites = func(w hook.Writes) any { return &Writes{w} }
}
