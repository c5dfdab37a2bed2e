package rebuild

import (
	"slices"
	"strings"

	"github.com/keyswap/keyswap/index"
	"github.com/redis/rueidis"
)

// merged is one Merge call of a batch: entries of a commutative command on
// a temp key, which the sender may merge with the same command on the same
// key from other batches.
type merged struct {
	t    *target
	name string
	args []string
}

// coalescer holds the entries of AnyOrder builders' Merge calls until a
// command is full (index.MaxArgs entries), or until it holds more than
// bound entries in all, and turns them into commands. Only the sender uses
// it. Each key's entries wait in its target, so that adding them costs no
// lookup: a family of 100,000 buckets gets a Merge per bucket per batch.
//
// A streaming run cannot group a family's members by bucket the way a bulk
// load can: each batch spreads over every bucket, so a batch of 2000 over
// 1000 buckets becomes 1000 two-member SADDs, each a command for Redis to
// parse and dispatch. Merging them across batches makes the commands as
// full as the buffer allows.
type coalescer struct {
	held  []*target // the targets holding entries (and some that no longer do)
	total int       // entries held
	bound int       // Options.MaxMerged
}

// mergeBuf is one key's merged entries waiting in the coalescer: entries
// of command name, end to end in data, entry i ending at ends[i].
type mergeBuf struct {
	data strings.Builder
	ends []int32
	name string
}

// pending returns the number of t's entries waiting in the coalescer.
func pending(t *target) int {
	if t.buf == nil {
		return 0
	}
	return len(t.buf.ends)
}

// mergedCmd is one command the coalescer emits.
type mergedCmd struct {
	t    *target
	name string
	args []string
}

// add takes the Merge calls of a batch, and returns the commands that are
// full, or, when more than bound entries are held, the largest ones until
// half of bound is left.
//
// The entries that wait are copied end to end into their key's buffer,
// while the batch's items are still in the CPU's cache, so that writing a
// command later reads one contiguous string rather than a thousand strings
// spread over the heap, and the items' own strings can be collected at
// once. A batch's entries that fill a command by themselves, on a key that
// holds none, go as they are: nothing waits, so nothing is copied.
func (co *coalescer) add(ms []merged) []mergedCmd {
	var out []mergedCmd
	for _, m := range ms {
		t := m.t
		if t.buf != nil && t.buf.name != m.name {
			// Another command on the same key: what is held goes first.
			out = append(out, co.take(t))
		}
		args := m.args
		for t.buf == nil && full(args) {
			// A full command of this batch alone, as a Set's batches
			// give: sent as it is, with nothing to copy.
			out = append(out, mergedCmd{t, m.name, args[:index.MaxArgs:index.MaxArgs]})
			args = args[index.MaxArgs:]
		}
		for _, e := range args {
			if t.buf != nil && t.buf.data.Len()+len(e) > maxMergeBytes {
				out = append(out, co.take(t))
			}
			if t.buf == nil {
				t.buf = &mergeBuf{name: m.name}
			}
			b := t.buf
			b.data.WriteString(e)
			b.ends = append(b.ends, int32(b.data.Len()))
			co.total++
			if len(b.ends) == index.MaxArgs {
				out = append(out, co.take(t))
			}
		}
		if t.buf != nil && !t.held {
			t.held = true
			co.held = append(co.held, t)
		}
	}
	if co.total > co.bound {
		out = append(out, co.spill(co.bound/2)...)
	}
	return out
}

// full reports whether the first index.MaxArgs of args make a command
// within maxMergeBytes.
func full(args []string) bool {
	if len(args) < index.MaxArgs {
		return false
	}
	n := 0
	for _, a := range args[:index.MaxArgs] {
		n += len(a)
	}
	return n <= maxMergeBytes
}

// maxMergeBytes bounds the bytes of a merged command's entries, far below
// the 2 GiB its offsets can count: an entry may be up to 512 MB.
const maxMergeBytes = 64 << 20

// take returns t's entries as a command, and drops its buffer; t must
// hold entries. The command's arguments are slices of the buffer's string,
// which is not copied.
func (co *coalescer) take(t *target) mergedCmd {
	b := t.buf
	all := b.data.String()
	args := make([]string, len(b.ends))
	start := int32(0)
	for i, end := range b.ends {
		args[i] = all[start:end]
		start = end
	}
	co.total -= len(b.ends)
	// Not kept for reuse: memory then follows the entries held, not the
	// number of keys ever written.
	t.buf = nil
	return mergedCmd{t, b.name, args}
}

// spill returns the largest buffers as commands until at most keep entries
// are held.
func (co *coalescer) spill(keep int) []mergedCmd {
	held := co.held[:0]
	for _, t := range co.held {
		if t.buf != nil {
			held = append(held, t)
		} else {
			t.held = false
		}
	}
	slices.SortStableFunc(held, func(a, b *target) int { return pending(b) - pending(a) })
	var out []mergedCmd
	for len(held) > 0 && co.total > keep {
		out = append(out, co.take(held[0]))
		held[0].held = false
		held = held[1:]
	}
	co.held = slices.Clone(held)
	return out
}

// drain returns every buffer as commands.
func (co *coalescer) drain() []mergedCmd { return co.spill(0) }

// pack packs cmds into transactions of at most perTxn entries each.
func pack(cb rueidis.Builder, cmds []mergedCmd, perTxn int) []*txn {
	var out []*txn
	var cur *txn
	for _, m := range cmds {
		if cur == nil || cur.entries+len(m.args) > perTxn && cur.entries > 0 {
			cur = &txn{label: "merged writes"}
			out = append(out, cur)
		}
		cur.cmds = append(cur.cmds, cb.Arbitrary(m.name).Keys(m.t.Key).Args(m.args...).Build())
		cur.writes = append(cur.writes, m.t)
		cur.entries += len(m.args)
		var members []string
		if strings.EqualFold(m.name, "SADD") {
			members = m.args
		}
		cur.members = append(cur.members, members)
	}
	return out
}
