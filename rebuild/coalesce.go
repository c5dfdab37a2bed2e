package rebuild

import (
	"slices"

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

// mergeKey names one buffer of merged entries.
type mergeKey struct {
	t    *target
	name string
}

// coalescer holds the entries of Commutative builders' Merge calls until a
// command is full (MaxMergeArgs entries), or until it holds more than
// bound entries in all, and turns them into commands. Only the sender uses
// it.
//
// A streaming run cannot group a family's members by bucket the way a bulk
// load can: each batch spreads over every bucket, so a batch of 2000 over
// 1000 buckets becomes 1000 two-member SADDs, each a command for Redis to
// parse and dispatch. Merging them across batches makes the commands as
// full as the buffer allows.
type coalescer struct {
	bufs  map[mergeKey][]string
	total int // entries held
	bound int // Options.MaxMerged
}

// MaxMergeArgs is the most entries a merged command carries.
const MaxMergeArgs = 1000

// mergedCmd is one command the coalescer emits.
type mergedCmd struct {
	t    *target
	name string
	args []string
}

// add takes the Merge calls of a batch, and returns the commands that are
// full, or, when more than bound entries are held, the largest ones until
// half of bound is left.
func (co *coalescer) add(ms []merged) []mergedCmd {
	var out []mergedCmd
	for _, m := range ms {
		k := mergeKey{m.t, m.name}
		buf := co.bufs[k]
		for len(m.args) > 0 {
			n := min(MaxMergeArgs-len(buf), len(m.args))
			buf = append(buf, m.args[:n]...)
			m.args = m.args[n:]
			co.total += n
			if len(buf) == MaxMergeArgs {
				out = append(out, mergedCmd{m.t, m.name, buf})
				co.total -= len(buf)
				buf = nil
			}
		}
		if len(buf) > 0 {
			co.bufs[k] = buf
		} else {
			delete(co.bufs, k)
		}
	}
	if co.total > co.bound {
		out = append(out, co.spill(co.bound/2)...)
	}
	return out
}

// spill returns the largest buffers as commands until at most keep entries
// are held.
func (co *coalescer) spill(keep int) []mergedCmd {
	ks := make([]mergeKey, 0, len(co.bufs))
	for k := range co.bufs {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b mergeKey) int { return len(co.bufs[b]) - len(co.bufs[a]) })
	var out []mergedCmd
	for _, k := range ks {
		if co.total <= keep {
			break
		}
		buf := co.bufs[k]
		out = append(out, mergedCmd{k.t, k.name, buf})
		co.total -= len(buf)
		delete(co.bufs, k)
	}
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
	}
	return out
}
