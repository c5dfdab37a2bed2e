package rebuild

import (
	"errors"
	"fmt"
	"hash/maphash"
	"slices"

	"github.com/keyswap/keyswap/index"
	"github.com/redis/rueidis"
)

// commands collects the commands one batch sends: what an index.Commands
// that a builder receives in Build wraps.
type commands struct {
	cb      rueidis.Builder
	targets *targets
	builder int // index of the builder now building
	cmds    rueidis.Commands
	owners  []int     // owners[i] is the builder that added cmds[i]
	entries []int64   // entries written, per builder
	skipped []int64   // entries skipped for a reserved key, per builder
	touched []*target // temp keys this batch's commands write (from Temp), in order
	merged  []merged  // this batch's Merge calls
	margs   []string  // their entries, end to end
	// The bucket and target that the last MergeBucket to look a bucket up
	// found, so that the next call on the same bucket, while the target is
	// still the last record's, needs neither a lookup nor a read of the
	// target (which, among 100,000 buckets, is a cache miss).
	lastBucket  string
	lastBuilder int
	lastT       *target
	hint        int                // the batch's items: margs's first capacity, and merged's once it has two records
	err         error              // the first argument over maxBulk
	seen        map[*target]bool   // set of touched
	temps       map[string]*target // this batch's cache of targets.get
	writes      [][]uint64         // hashes of the entries written, per builder (ByEntry builders); sorted once built
}

// newCommands returns the Commands of one batch of a run of n builders.
func newCommands(cb rueidis.Builder, ts *targets, n int) *commands {
	return &commands{cb: cb, targets: ts, entries: make([]int64, n), skipped: make([]int64, n), seen: map[*target]bool{}, temps: map[string]*target{}}
}

// entrySeed seeds the hashes of the entries that ByEntry builders write.
var entrySeed = maphash.MakeSeed()

// Entry records that the builder now building writes entry (a hash field,
// a sorted-set member) in this batch. A [index.ByEntry] builder calls it for every
// entry it writes; for a family, an entry of any of its keys. Two batches
// that write a common entry of one builder are sent in order.
func (c *commands) Entry(entry string) {
	if c.writes == nil {
		c.writes = make([][]uint64, len(c.entries))
	}
	c.writes[c.builder] = append(c.writes[c.builder], maphash.String(entrySeed, entry))
}

// sortEntries sorts the recorded entry hashes, for conflicts. The batch's
// goroutine calls it once every builder has built.
func (c *commands) sortEntries() {
	for _, w := range c.writes {
		slices.Sort(w)
	}
}

// conflicts reports whether c and o write a common entry of one builder. A
// collision of two entries' 64-bit hashes reports a conflict too, which
// only costs an overlap.
func (c *commands) conflicts(o *commands) bool {
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

// B returns the command builder for the commands passed to [index.Commands.Add].
func (c *commands) B() rueidis.Builder { return c.cb }

// Temp returns this run's temp key for the live key live, which must be the
// builder's own key or, for a [index.Family] builder, a key "<prefix>:<bucket>"
// with a non-empty bucket. Any other key is an error, and the rebuild fails
// without publishing anything.
//
// For a family bucket whose key has the shape of keyswap's own keys (a
// bucket named "rebuild-lock", say), Temp returns an error matching
// [index.ErrReservedKey]: skip the entry, and the run goes on. Each such call
// counts one skipped entry in Stats.Skipped.
//
// Commands passed to Add must write only to keys returned by Temp.
func (c *commands) Temp(live string) (string, error) {
	t := c.temps[live]
	if t == nil || t.builder != c.builder {
		var err error
		if t, err = c.targets.get(c.builder, live); err != nil {
			if errors.Is(err, index.ErrReservedKey) && c.targets.owners[c.builder].family {
				c.skipped[c.builder]++
				c.targets.skipped(live)
			}
			return "", err
		}
		c.temps[live] = t
	}
	if !c.seen[t] {
		c.seen[t] = true
		c.touched = append(c.touched, t)
	}
	return t.Key, nil
}

// Merge adds entries of a command (such as SADD) on the temp key of the
// live key live, which Temp would return: command name, that key, then the
// entries, one argument each. The Rebuilder may merge them with the same
// command on the same key from other batches, and send them later, in
// commands of up to index.MaxArgs entries: a family's buckets then get full
// commands although each batch spreads over all of them.
//
// Only a [index.AnyOrder] builder may call Merge, for a command whose writes
// give the same result in any order and any grouping (SADD, PFADD), whose
// only key is its first argument; the run fails otherwise. Its errors are
// Temp's. An entry over Redis's 512 MB limit fails the run before anything
// of the batch is sent, as Add's arguments do. Each entry counts in
// Stats.Entries; a Merge of no entries writes nothing, not even the key.
func (c *commands) Merge(live, name string, entries ...string) error {
	if n := len(c.merged); n > 0 && c.merged[n-1].t.Live == live && c.merged[n-1].t.builder == c.builder {
		// The same key as the last call, as a builder that merges item by
		// item asks: no lookup.
		c.merge(c.merged[n-1].t, name, entries)
		return nil
	}
	// No cache of this batch's keys, unlike Temp: the registry finds a key
	// seen before with one lookup.
	t, err := c.targets.get(c.builder, live)
	if err != nil {
		return c.refused(live, err, len(entries))
	}
	c.merge(t, name, entries)
	return nil
}

// MergeBucket is [index.Commands.Merge] on the bucket "<prefix>:<bucket>" of a
// [index.Family] builder, whose Key is prefix, without building that key: the
// bucket's temp key is found with one lookup of its name, shared by every
// batch. It is the cheap way to merge a family's entries one item at a
// time, as SetIndex does; its errors are Merge's, and calling it from a
// builder that is not a Family fails the run.
func (c *commands) MergeBucket(bucket, name string, entries ...string) error {
	o := c.targets.owners[c.builder]
	if !o.family {
		err := fmt.Errorf("builder %q called MergeBucket but is not a Family: only a family has buckets", o.key)
		if c.err == nil {
			c.err = err
		}
		return err
	}
	if n := len(c.merged); n > 0 && c.merged[n-1].t == c.lastT && c.lastBucket == bucket && c.lastBuilder == c.builder {
		c.merge(c.lastT, name, entries)
		return nil
	}
	t, err := c.targets.bucket(c.builder, bucket)
	if err != nil {
		return c.refused(o.key+":"+bucket, err, len(entries))
	}
	c.merge(t, name, entries)
	c.lastBucket, c.lastBuilder, c.lastT = bucket, c.builder, t
	return nil
}

// refused accounts for entries a Merge could not write to live, which get
// refused with err: a family's reserved bucket is skipped and counted.
func (c *commands) refused(live string, err error, entries int) error {
	if errors.Is(err, index.ErrReservedKey) && c.targets.owners[c.builder].family {
		c.skipped[c.builder] += int64(entries)
		c.targets.skipped(live)
	}
	return err
}

// merge records a Merge of entries on t. The entries of a batch's Merge
// calls are kept end to end in one slice, and consecutive calls on the same
// key and command are one record: a builder may merge item by item at the
// cost of an append.
func (c *commands) merge(t *target, name string, entries []string) {
	if !c.targets.owners[c.builder].commutative && c.err == nil {
		c.err = fmt.Errorf("builder %q called Merge but is not AnyOrder: merged writes reach Redis in no set order", c.targets.owners[c.builder].key)
	}
	c.entries[c.builder] += int64(len(entries))
	if len(entries) == 0 {
		return
	}
	c.checkBulk(name, t.Live, entries)
	if c.margs == nil {
		c.margs = make([]string, 0, max(c.hint, len(entries)))
	}
	c.margs = append(c.margs, entries...)
	if n := len(c.merged); n > 0 && c.merged[n-1].t == t && c.merged[n-1].name == name {
		// The last record's entries are the tail of margs.
		last := &c.merged[n-1]
		last.args = c.margs[len(c.margs)-len(last.args)-len(entries):]
		return
	}
	if len(c.merged) == cap(c.merged) {
		// A builder that merges on one key makes one record per batch; a
		// family about one per item: its second record makes room for the
		// batch, rather than growing the slice a few records at a time.
		n := 1
		if len(c.merged) > 0 {
			n = max(c.hint, 2*len(c.merged))
		}
		c.merged = append(make([]merged, 0, n), c.merged...)
	}
	c.merged = append(c.merged, merged{t: t, name: name, args: c.margs[len(c.margs)-len(entries):]})
}

// Add appends cmd, which writes entries index entries (fields, members), to
// the batch. The entry count feeds [Stats].Entries. A command with an
// argument over Redis's 512 MB limit, or one whose keys are not all temp
// keys the builder got from Temp in this batch, fails the rebuild before
// anything of the batch is sent. (The Rebuilder finds a command's keys with
// COMMAND INFO, once per command name, or COMMAND GETKEYS for a command
// whose keys move with its arguments.)
func (c *commands) Add(cmd rueidis.Completed, entries int) {
	if args := cmd.Commands(); len(args) > 0 {
		c.checkBulk(args[0], args[min(1, len(args)-1)], args[1:])
	}
	c.cmds = append(c.cmds, cmd)
	c.owners = append(c.owners, c.builder)
	c.entries[c.builder] += int64(entries)
}

// maxBulk is Redis's default proto-max-bulk-len: the largest argument a
// command may carry.
const maxBulk = 512 << 20

// checkBulk fails the batch, unless it already failed, if an argument of
// the command name on key is over maxBulk: Redis would refuse it, and
// reset the connection in the middle of the batch (SPEC C52). Add checks
// every argument, merge every entry, before anything of the batch is sent.
func (c *commands) checkBulk(name, key string, args []string) {
	if c.err != nil {
		return
	}
	for _, a := range args {
		if len(a) > maxBulk {
			c.err = fmt.Errorf("%s on %q has an argument of %d bytes, over the 512 MB Redis accepts (proto-max-bulk-len)", name, key, len(a))
			return
		}
	}
}
