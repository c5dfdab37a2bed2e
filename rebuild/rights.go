package rebuild

import (
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
)

// rightsBucket names the bucket of a family whose keys stand for every
// bucket's in the rights checked up front: ACL rules grant rights by key
// pattern, and the buckets a run will write are not known before it runs.
// The publish checks every bucket again.
const rightsBucket = "keyswap-rights"

// catchUpCommands are the commands a catch-up may send to a temp key: the
// ops of a logged change (HDELIF and ZREMIF run as a script, with EVAL,
// and send HGET, HDEL, ZSCORE and ZREM), and EXISTS, which tells a key a
// replayed change emptied from one lost before it.
var catchUpCommands = []string{"HSET", "HDEL", "HGET", "ZADD", "ZREM", "ZSCORE", "SADD", "SREM", "EXISTS", "EXPIRE", "TYPE"}

// tailCommands are the commands the publish may send to a live key when it
// replays the changes logged after the last catch-up.
var tailCommands = []string{"HSET", "HDEL", "HGET", "ZADD", "ZREM", "ZSCORE", "SADD", "SREM", "TYPE"}

// checks returns every right a run of r that writes to ts may need (held:
// it is Build's), for the acquire script to check before anything is
// written: a missing one fails the run at once, naming it, rather than
// after the build. The acquire script checks its own commands; the publish
// checks every key it touches again, each family bucket included.
func (r *core) checks(ts *targets, held bool) []protocol.Check {
	var c []protocol.Check
	add := func(key string, cmds ...string) {
		for _, cmd := range cmds {
			c = append(c, protocol.Check{Command: cmd, Key: key})
		}
	}
	// Commands without keys: the transactions of batches and catch-ups,
	// and the SCAN of a family's live buckets.
	add("", "MULTI", "EXEC")
	cluster := r.redis.Names()
	first := r.lockKeys[0]
	for i, l := range r.lockKeys {
		rec, log := keys.RecordKey(l), keys.LogKey(l)
		// The heartbeat, the refresh, the release and the publish's fence.
		add(l, "GET", "EXPIRE", "DEL")
		add(rec, "HGET", "HMGET", "EXPIRE", "DEL")
		add(log, "EXISTS", "EXPIRE", "LLEN", "LRANGE", "DEL")
		if i == 0 {
			// The batches' counter, the status, a durability wait's write.
			add(rec, "HINCRBY", "HSET")
		}
	}
	ctl, receipt := keys.CtlKey(first), keys.ReceiptKey(first)
	add(ctl, "EXISTS", "EXPIRE", "HMGET", "DEL")
	add(receipt, "GET", "SET", "DEL")
	reviewed := held || len(r.opts.Guards) > 0
	for i, o := range r.owners {
		live := o.key
		if o.family {
			live = o.key + ":" + rightsBucket
			add("", "SCAN")
		}
		temp := ts.newTemp(live)
		// Batches, refreshes and the publish on the temp key, and the
		// publish on the live key.
		add(temp, "EXPIRE", "PTTL", "UNLINK", "RENAME")
		add(live, "UNLINK", "PERSIST")
		if o.incremental {
			// The changes Apply logs, replayed by the catch-up onto the
			// temp key and by the publish onto the live key: a builder's
			// Diff may write any of them.
			add(temp, catchUpCommands...)
			add("", "EVAL")
			add(live, tailCommands...)
		}
		if r.opts.KeepPrevious > 0 {
			prev := keys.PrevKey(live, cluster)
			add(live, "EXISTS")
			add(prev, "UNLINK", "PEXPIRE")
		}
		if reviewed {
			// The guards' and a held run's review: each key's type and size.
			add(temp, "HLEN", "ZCARD", "SCARD")
			add(live, "HLEN", "ZCARD", "SCARD")
		}
		add(keys.MetaKey(r.lives[i], cluster), "TYPE", "HINCRBY", "HGET", "HSET", "HDEL")
		ptr, reg := keys.PointerKey(r.lives[i], cluster), keys.RegistryKey(r.lives[i], cluster)
		if r.opts.Publish != Generations {
			// The publish's switch back from Generations mode: it deletes
			// the pointer and retires the registry's generations.
			add(ptr, "GET", "DEL")
			add(reg, "TYPE", "HGETALL", "HSET")
			continue
		}
		r.genChecks(i, temp, add)
	}
	if r.opts.Publish == Generations {
		r.runGenChecks(add)
	}
	return c
}

// genChecks adds, for index i of a run in Generations mode whose temp key
// (in the run's naming) is temp, the rights of its allocation, flip and
// removals.
func (r *core) genChecks(i int, temp string, add func(key string, cmds ...string)) {
	cluster := r.redis.Names()
	ptr, reg := keys.PointerKey(r.lives[i], cluster), keys.RegistryKey(r.lives[i], cluster)
	// The allocation, the flip, and the removal of the run's failed
	// or retired generations (gens: reading the registry, the pointer
	// and the lock with their types, then deleting chunks found by
	// SCAN, each with the state checked, and the field last).
	add(ptr, "GET", "SET", "TYPE")
	add(reg, "HINCRBY", "HSET", "HGET", "HGETALL", "HDEL", "TYPE")
	add(r.lockKeys[i], "TYPE")
	if r.opts.Group != "" {
		// The claim (SPEC C102): the pointer and the registry of the index
		// without a group, read, the pointer set to the group's marker,
		// and the registry's next raised to the generation reserved.
		own := keys.Names{Cluster: cluster.Cluster}
		add(keys.PointerKey(r.lives[i], own), "TYPE", "GET", "SET")
		add(keys.RegistryKey(r.lives[i], own), "TYPE", "HKEYS", "HGET", "HSET")
		if keys.Aliasable(r.lives[i], own.Cluster) {
			// The owner stamp of the index's own base, where another
			// index can have it (SPEC C104).
			add(keys.OwnerKey(r.lives[i], own), "TYPE", "GET", "SET")
		}
	}
	add(temp, "UNLINK")
	add("", "SCAN", "TIME")
	if r.owners[i].family && keys.SameSlot(r.lives[i], cluster) {
		// The generation's manifest: the writes add to it, the removal
		// reads it, and deletes its chunks in WATCH ... EXEC.
		add(keys.ManifestKey(r.lives[i], cluster, 0), "SADD", "SISMEMBER", "SSCAN", "UNLINK")
		add(keys.ManifestListKey(r.lives[i], cluster, 0), "RPUSH", "TYPE", "LLEN", "LRANGE", "UNLINK")
		add(reg, "WATCH")
		add("", "MULTI", "EXEC", "UNWATCH")
	}
}

// runGenChecks adds the rights a run in Generations mode needs once, not
// per index: its cut-over marks and, on a cluster, its per-slot counters.
func (r *core) runGenChecks(add func(key string, cmds ...string)) {
	cluster := r.redis.Names()
	if r.opts.SkipSizeCheck {
		// The masters' evicted_keys and run_id, read at the start and
		// before the flip (see evictionWatch).
		add("", "INFO")
	}
	for _, l := range r.lockKeys {
		// The cut-over marks: the flip reads each, and deletes those
		// the run set; a run whose keys spread over a cluster's
		// slots sets them (SET with PX) after a flip refused for a
		// tail.
		mark := keys.CutOverKey(l)
		add(mark, "GET")
		if r.spreads() {
			add(mark, "SET", "DEL")
		}
	}
	if cluster.Cluster {
		// The per-slot counters of the run's writes (the slot does not
		// change the rights an ACL pattern grants), and the SET of one
		// that a durability wait on a claim's master writes.
		cmds := []string{"INCR", "EXPIRE", "GET", "UNLINK"}
		if r.opts.Group != "" && r.durability() != (protocol.Durability{}) {
			cmds = append(cmds, "SET")
		}
		add(keys.CounterKey(keys.Base(r.lives[0], cluster), 0, 0), cmds...)
	}
}
