package rebuild

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/redis/rueidis"
)

// bulkWait is how long a run's first write waits for the run's own
// connection (see newBulk) before it goes on the client's shared ones.
const bulkWait = time.Second

// writer is a run's write stage: it sends round trips of transactions in
// one DoMulti each (write; writeSpread on a cluster in Generations mode),
// with the heartbeat of the run's lease when one is due, and checks every
// reply. It owns the connections of the writes (bulk), the run's record,
// which counts the transactions Redis acknowledged, the temp keys' TTL,
// which the lease raises, and in Generations mode the run's generations,
// whose size check and per-slot counters it feeds. startPipeline makes it
// once the run's generations are allocated; the sender and the catch-up
// call write, and the publish reads the count of acknowledged transactions
// from acked, the run's progress.
type writer struct {
	r      *core
	record string         // the run's record: batches written, status, requests
	bulk   *protocol.Bulk // the connections of the writes
	// tempSecs is the temp keys' TTL in seconds: twice the lease, or more
	// when refreshing them takes long (see lease.tempTTL).
	tempSecs atomic.Int64
	gen      *generations  // nil in RenameInPlace mode
	acked    *atomic.Int64 // the run's: transactions Redis acknowledged
	lease    func() *lease // the run's lease now: a resumed lease replaces it
	// masters are, on a cluster in Generations mode, the masters of the
	// slots (see writer.slotMasters); nil until read.
	masters atomic.Pointer[slotMasters]
}

// newWriter returns the writer of a run of r whose writes end with ctx
// (see newBulk): gen is the run's generations (nil in RenameInPlace mode),
// acked its count of acknowledged transactions, and lease returns its
// lease.
func newWriter(ctx context.Context, r *core, gen *generations, acked *atomic.Int64, lease func() *lease) *writer {
	w := &writer{r: r, record: keys.RecordKey(r.lockKeys[0]), gen: gen, acked: acked, lease: lease}
	w.bulk = newBulk(ctx, r)
	w.tempSecs.Store(r.tempSecs)
	return w
}

// newBulk returns the connections of the run's writes, apart from the
// pipelined connections the application shares with the run through its
// client, so that the application's commands do not wait behind the run's
// round trips on the way to Redis and back. The first write asks for one. While
// the client's blocking pool gives none (or the one it gave fails), the
// writes go on the shared connections, and the run warns once, then logs
// at the Info level when they have one again. A connection that closes, or
// whose server no longer serves the run's slot, is replaced, and logged at
// the Info level.
func newBulk(ctx context.Context, r *core) *protocol.Bulk {
	b := protocol.NewBulk(ctx, r.redis.Client(), bulkWait, protocol.BulkEvents{
		Shared: func(waited time.Duration, err error) {
			if err != nil {
				r.opts.Logger.Warn("keyswap: the connection of the run's writes failed; they go on the client's shared connections, where the application's commands wait behind them, until a new one works",
					"key", r.key, "error", err)
				return
			}
			r.opts.Logger.Warn("keyswap: no connection of the client's blocking pool (rueidis ClientOption.BlockingPoolSize) came free for the run's writes; they go on the client's shared connections, where the application's commands wait behind them, until one does",
				"key", r.key, "waited", waited)
		},
		Own: func() {
			r.opts.Logger.Info("keyswap: the run's writes have a connection of their own again", "key", r.key)
		},
		Lost: func(err error) {
			r.opts.Logger.Info("keyswap: the connection of the run's writes closed between two writes; they go on a new one", "key", r.key, "error", err)
		},
		Moved: func(err error) {
			r.opts.Logger.Info("keyswap: the hash slot of the run's writes moved to another server; the redirected write went on the client's shared connections, and the next write takes a connection to that server", "key", r.key, "error", err)
		},
	})
	return b
}

// txn is one MULTI/EXEC transaction of a round trip: the writes of a
// source batch, or merged writes of AnyOrder builders.
type txn struct {
	label   string           // for errors
	cmds    rueidis.Commands // the writes
	writes  []*target        // the temp keys cmds write
	expire  []*target        // those that get an EXPIRE NX: set by the sender
	entries int              // merged writes: the entries of cmds
	// members are, for a merged SADD of cmds, its members (nil for other
	// commands): SADD must add every one of them to a builder's key whose
	// members belong to one item each (see owner.unique).
	members [][]string
	// sized is, in Generations mode, what each of cmds does to the size
	// of its key (see sizeCheck), read before cmds are sent; nil with
	// SkipSizeCheck.
	sized []sizedWrite
	// probes are temp keys that cmds may leave empty (a replayed change
	// that removes entries): EXISTS before and after the writes tells a key
	// emptied by them from one lost before them.
	probes []*target
}

// batchTxn returns b's writes as a transaction.
func batchTxn(b *batch) *txn {
	return &txn{label: fmt.Sprintf("batch %d (%d items)", b.seq, b.items), cmds: b.c.cmds, writes: b.c.touched}
}

// write sends txns in one DoMulti. Each is one MULTI ... EXEC of its writes,
// an EXPIRE NX of each temp key it writes, so that no temp key exists
// without a TTL, and an HINCRBY of
// the run's record (with an EXPIRE NX), so that the publish can tell
// whether Redis still holds every transaction it acknowledged. If the
// connection breaks before EXEC arrives, the server drops the transaction;
// if EXEC runs late, the TTL and the count come with the writes. At the end
// of the DoMulti rides the heartbeat, when one is due. write checks every
// reply; the sender accounts for the batches.
func (x *writer) write(ctx context.Context, txns []*txn) error {
	r := x.r
	if x.gen != nil {
		// Generations mode: the data keys carry no TTL, and their sizes
		// are counted (see sizeCheck), unless SkipSizeCheck.
		for _, t := range txns {
			t.expire = nil
			if x.gen.sizes != nil {
				t.sized = x.gen.sizes.sizeWrites(t.cmds)
			}
		}
		if r.redis.Cluster() {
			return x.writeSpread(ctx, txns)
		}
	}
	cb := r.redis.Client().B()
	var cmds rueidis.Commands
	listed := make([]int, len(txns))
	for i, t := range txns {
		cmds = append(cmds, cb.Multi().Build())
		for _, tg := range t.probes {
			cmds = append(cmds, cb.Exists().Key(tg.Key).Build())
		}
		cmds = append(cmds, t.cmds...)
		for _, tg := range t.expire {
			// NX: only a key this transaction created has no TTL yet, so a
			// reply of 1 is the creation of the temp key, and a second one
			// for the same key is a loss (see protocol.Temp.Created).
			cmds = append(cmds, cb.Expire().Key(tg.Key).Seconds(x.tempSecs.Load()).Nx().Build())
		}
		for _, tg := range t.probes {
			cmds = append(cmds, cb.Exists().Key(tg.Key).Build())
		}
		if x.gen != nil {
			// The families' manifests, in the transaction of the writes.
			l := x.listing(cb, t.writes, -1)
			listed[i] = len(l)
			cmds = append(cmds, l...)
		}
		// The record lives as long as the lock; should the lease lapse with
		// this transaction in flight, EXPIRE NX bounds the record it
		// re-creates.
		cmds = append(cmds, cb.Hincrby().Key(x.record).Field("batches").Increment(1).Build(),
			cb.Expire().Key(x.record).Seconds(r.ttlSecs).Nx().Build(), cb.Exec().Build())
	}
	sent := time.Now()
	l := x.lease()
	h, beat := l.claim(sent, false)
	if beat {
		cmd, err := l.command(h)
		if err != nil {
			l.settle(ctx, sent, h, nil) // reports the same error
			beat = false
		} else {
			cmds = append(cmds, cmd)
		}
	}

	// The writes are not cancelled with the run: once sent they will run,
	// and the cleanup must come after them. A write that outlives the lease
	// is bounded by it. Every key of the DoMulti is in the slot of the
	// run's record.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.TTL)
	defer cancel()
	res := x.bulk.DoMulti(ctx, wctx, x.record, cmds...)
	if beat {
		l.settle(wctx, sent, h, &res[len(res)-1])
	}
	for i, t := range txns {
		n := len(t.cmds) + len(t.expire) + 2*len(t.probes) + listed[i] + 2
		if err := x.check(t, res[:n+2]); err != nil {
			return err
		}
		x.acked.Add(1)
		res = res[n+2:]
	}
	return nil
}

// check checks the replies to transaction t.
func (x *writer) check(t *txn, res []rueidis.RedisResult) error {
	key := x.r.key
	fail := func(err error) error { return &Error{Op: "write", Key: key, Err: err} }
	n := len(res) - 2
	replies, err := execReplies(res, n)
	if err != nil {
		if perr := refused(err); perr != nil {
			err = perr
		}
		return fail(fmt.Errorf("%s: %w", t.label, err))
	}
	probes := len(t.probes)
	before, replies := replies[:probes], replies[probes:]
	writes := len(t.cmds)
	if err := x.checkWrites(t, replies[:writes]); err != nil {
		return fail(err)
	}
	after := replies[writes+len(t.expire) : writes+len(t.expire)+probes]
	probed, err := checkProbes(t, before, after)
	if err != nil {
		return fail(err)
	}
	if err := checkExpires(t, replies, probed); err != nil {
		return fail(err)
	}
	// The manifests' SADD (Generations mode) come between the probes and
	// the record: a manifest that missed a key would let the removal of
	// the generation leave it behind.
	for _, m := range replies[writes+len(t.expire)+probes : len(replies)-2] {
		if err := m.Error(); err != nil {
			return fail(fmt.Errorf("%s, the manifest of its generation: %w", t.label, err))
		}
	}
	for _, m := range replies[len(replies)-2:] {
		if err := m.Error(); err != nil {
			return fail(fmt.Errorf("the record %s: %w", x.record, err))
		}
	}
	return nil
}

// checkWrites checks the replies to t's writes, and counts the entries
// they added.
func (x *writer) checkWrites(t *txn, replies []rueidis.RedisMessage) error {
	writes := len(t.cmds)
	for i, m := range replies {
		if err := m.Error(); err != nil {
			if perr := refused(err); perr != nil {
				err = perr
			}
			return fmt.Errorf("%s, command %d of %d: %w", t.label, i+1, writes, err)
		}
		if i < len(t.members) && t.members[i] != nil && x.r.owners[t.writes[i].builder].unique {
			if added, err := m.AsInt64(); err == nil && added < int64(len(t.members[i])) {
				return sharedMember(t.writes[i].Live, t.members[i], added)
			}
		}
		if i < len(t.sized) {
			countWrite(t.sized[i], m)
		}
	}
	return nil
}

// checkProbes checks the EXISTS of t's probes before and after its writes,
// and returns the targets probed.
func checkProbes(t *txn, before, after []rueidis.RedisMessage) (map[*target]bool, error) {
	probed := make(map[*target]bool, len(t.probes))
	for i, tg := range t.probes {
		was, err1 := before[i].AsInt64()
		is, err2 := after[i].AsInt64()
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("EXISTS %s: %w", tg.Key, err)
		}
		if was == 0 && tg.Populated() {
			return nil, tg.Lost("vanished before a replayed change reached it")
		}
		// Emptied by the change, or still holding entries (perhaps
		// emptied and re-created by it): either way what is there is
		// the rebuild's.
		tg.SetPopulated(is == 1)
		probed[tg] = true
	}
	return probed, nil
}

// checkExpires checks the replies to t's EXPIRE NX, which follow those to
// its writes in replies (the replies after its probes'), and marks the
// targets they created.
func checkExpires(t *txn, replies []rueidis.RedisMessage, probed map[*target]bool) error {
	writes := len(t.cmds)
	for i, tg := range t.expire {
		created, err := replies[writes+i].AsInt64()
		if err != nil {
			return fmt.Errorf("EXPIRE %s: %w", tg.Key, err)
		}
		if created == 1 && !probed[tg] {
			if err := tg.Created(); err != nil {
				return err
			}
		}
	}
	return nil
}

// refused returns err as an error matching ErrNoPermission, naming the
// command, when it holds Redis refusing a command for this user's rights,
// and nil otherwise.
func refused(err error) error {
	var rerr *rueidis.RedisError
	if !errors.As(err, &rerr) {
		return nil
	}
	if perr := protocol.Refused(rerr); perr != nil {
		return fmt.Errorf("%w (%w)", perr, err)
	}
	return nil
}

// sharedMember describes a SADD of members to live that added only added of
// them: a member was there already, written for another item.
func sharedMember(live string, members []string, added int64) error {
	which := "a member"
	seen := make(map[string]bool, len(members))
	for _, m := range members {
		if seen[m] {
			which = fmt.Sprintf("the member %q", m)
			break
		}
		seen[m] = true
	}
	if which == "a member" && len(members) == 1 {
		which = fmt.Sprintf("the member %q", members[0])
	}
	return fmt.Errorf("%s of %q is shared by two items of the source (SADD added %d of %d members): a member two items share cannot be maintained by Apply, which removes an item's member when the item moves, and would remove it for the other item too, so a Set or SetIndex keeps each member for one item; give each item a member of its own, such as its id; every live key left unchanged", which, live, added, len(members))
}

// expiring sets the temp keys of t that get an EXPIRE NX: every key it
// writes, once. Sending it with every write, not just the first, keeps the
// rule simple and strict: a temp key lost and re-created by a later write
// gets its TTL in the same transaction. It costs one command per key per
// transaction, which is small beside the writes: a batch writes few keys,
// and a merged command carries many entries.
func expiring(t *txn) {
	seen := map[*target]bool{}
	for _, tg := range t.writes {
		if !seen[tg] {
			seen[tg] = true
			t.expire = append(t.expire, tg)
		}
	}
}

// execReplies returns the replies to the n commands of a MULTI ... EXEC
// transaction, given the replies to all of its n+2 commands. A command the
// server refused to queue (OOM, a syntax error) aborts the transaction: its
// error is returned.
func execReplies(res []rueidis.RedisResult, n int) ([]rueidis.RedisMessage, error) {
	for i, r := range res[:n+1] { // MULTI, then each QUEUED
		if err := r.Error(); err != nil {
			if i == 0 {
				return nil, fmt.Errorf("MULTI: %w", err)
			}
			return nil, fmt.Errorf("command %d of %d: %w", i, n, err)
		}
	}
	replies, err := res[n+1].ToArray()
	if err != nil {
		return nil, fmt.Errorf("EXEC: %w", err)
	}
	if len(replies) != n {
		return nil, fmt.Errorf("EXEC returned %d replies for %d commands", len(replies), n)
	}
	return replies, nil
}
