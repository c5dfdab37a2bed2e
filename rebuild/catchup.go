package rebuild

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/run"
	"github.com/redis/rueidis"
)

// catchUpChunk is the most entries a catch-up reads from one log per round
// trip.
const catchUpChunk = 1000

// catchUpWork bounds the work (ops and arguments) a catch-up replays per
// round trip, over every log, so that entries of many ops each do not make
// one round trip of hundreds of megabytes: past it, a log's next read takes
// fewer entries. Every log replays at least one entry per round trip.
const catchUpWork = 50_000

// replayTxn is a transaction of replayed changes being built: its ops, and
// the temp key of each.
type replayTxn struct {
	t     *txn
	temps []string
	index map[*target]int
	ops   []run.Op
	at    []int
}

// catchUp replays the changes applied during the run (see Apply) onto the
// temp keys, from each lock's log, until what is left is short enough for
// the publish to replay: at most PublishTail entries, of at most
// PublishTailWork ops and arguments. It returns an error matching
// ErrFallingBehind once deadline has passed with more left, or when a log
// reached its bound.
//
// The logs are input from other processes. Each round trip reads, in one
// script per log (run.ReadLogCommand), the next entries, the log's length
// and the counts Apply keeps in the lock's record, with the record's token: a record gone
// lost its counts (ErrWritesLost), one of another token is forged
// (ErrTampered); a log shorter than its count lost changes
// (ErrWritesLost), a longer one holds entries nobody counted
// (ErrTampered). Every entry must be a change of its builder's keys
// (ErrTampered otherwise, naming the log, the entry and the key). The
// same round trip writes the previous entries: as transactions like the
// batches', which advance the run's record, so that the publish can tell
// whether Redis lost any of them.
func (x *execution[T]) catchUp(ctx context.Context, deadline time.Time) error {
	r := x.r
	cb := r.redis.Client().B()
	for {
		cmds := make(rueidis.Commands, 0, len(x.locks))
		for i, l := range x.locks {
			cmds = append(cmds, run.ReadLogCommand(cb, keys.LogKey(l.Key), keys.RecordKey(l.Key), x.offsets[i], x.offsets[i]+x.chunks[i]-1))
		}
		res := r.redis.Client().DoMulti(ctx, cmds...)
		var txns []*replayTxn
		var read, behind, work, roundWork int64
		for i, l := range x.locks {
			log := keys.LogKey(l.Key)
			entries, count, counted, token, err := run.ReadLogReply(res[i])
			if err != nil {
				if perr := run.Refused(err); perr != nil {
					err = perr
				}
				return run.Fail(ctx, "catch-up", r.key, fmt.Errorf("reading %s: %w", log, err))
			}
			// The counts are the record's: one gone (evicted) lost them,
			// one forged is not the run's.
			if token != l.Token {
				return &Error{Op: "catch-up", Key: r.lives[i], Err: run.RecordError(keys.RecordKey(l.Key), token != "")}
			}
			if err := x.logs.Check(i, count); err != nil {
				return &Error{Op: "catch-up", Key: r.lives[i], Err: err}
			}
			taken := len(entries)
			for j, e := range entries {
				if j > 0 && roundWork >= catchUpWork {
					taken = j // the rest is read again next round
					break
				}
				index := x.offsets[i] + int64(j)
				ops, err := run.DecodeEntry(e)
				if errors.Is(err, ErrFallingBehind) {
					return &Error{Op: "catch-up", Key: r.lives[i], Err: fmt.Errorf("%w: %s reached its bound of changes (Options.MaxChanges of the Rebuilder that applies them), so later changes were not logged; every live key left unchanged (and holds every change)", ErrFallingBehind, log)}
				}
				if err != nil {
					return &Error{Op: "catch-up", Key: r.lives[i], Err: run.BadEntry(log, index, err)}
				}
				if txns, err = x.replay(txns, i, index, ops); err != nil {
					return err
				}
				for _, op := range ops {
					x.work[i] += op.Work()
					roundWork += op.Work()
				}
			}
			if taken < len(entries) {
				x.chunks[i] = int64(max(1, taken))
			} else {
				x.chunks[i] = min(catchUpChunk, 2*x.chunks[i])
			}
			x.offsets[i] += int64(taken)
			read += int64(taken)
			behind += max(0, count.Len-x.offsets[i])
			work += max(0, counted-x.work[i])
		}
		if len(txns) > 0 {
			ts := make([]*txn, len(txns))
			for j, rt := range txns {
				rt.t.cmds = rueidis.Commands{run.ReplayCommand(cb, rt.temps, rt.ops, rt.at)}
				expiring(rt.t)
				ts[j] = rt.t
			}
			x.lease.temps.Lock()
			err := x.write(ctx, ts)
			x.lease.temps.Unlock()
			if err != nil {
				return err
			}
		}
		x.replayed.Add(read)
		switch {
		case behind <= PublishTail && work <= PublishTailWork:
			return nil
		case time.Now().After(deadline):
			return &Error{Op: "catch-up", Key: r.key, Err: fmt.Errorf("%w: %d changes (%d ops and arguments) still to replay after catching up for %v (Options.CatchUpTimeout): they arrive faster than the run replays them; every live key left unchanged (and holds every change)", ErrFallingBehind, behind, work, r.opts.CatchUpTimeout)}
		case ctx.Err() != nil:
			return nil // run reports the cause
		}
	}
}

// replay adds ops, entry index of the log of lock i, to txns as writes of
// builder i's temp keys: transactions of at most BatchSize ops, each
// replayed by one script (run.ReplayCommand). An op on a key that is not
// builder i's fails the run with ErrTampered, naming the log, the entry and
// the key: Apply logs no such op.
func (x *execution[T]) replay(txns []*replayTxn, i int, index int64, ops []run.Op) ([]*replayTxn, error) {
	o := x.r.owners[i]
	log := run.LogOffset{Key: keys.LogKey(x.locks[i].Key), Owner: o.key, Family: o.family}
	if err := run.CheckEntry(log, index, ops); err != nil {
		return nil, &Error{Op: "catch-up", Key: x.r.lives[i], Err: err}
	}
	for _, op := range ops {
		t, err := x.targets.get(i, op.Key)
		if errors.Is(err, ErrTooManyKeys) {
			return nil, &Error{Op: "catch-up", Key: x.r.lives[i], Err: fmt.Errorf("the changes applied during the run add keys past the bound: %w", err)}
		}
		if err != nil {
			return nil, &Error{Op: "catch-up", Key: x.r.lives[i], Err: err}
		}
		var cur *replayTxn
		if n := len(txns); n > 0 && len(txns[n-1].ops) < x.r.opts.BatchSize {
			cur = txns[n-1]
		} else {
			cur = &replayTxn{t: &txn{label: "replayed changes"}, index: map[*target]int{}}
			txns = append(txns, cur)
		}
		k, ok := cur.index[t]
		if !ok {
			k = len(cur.temps)
			cur.index[t] = k
			cur.temps = append(cur.temps, t.Key)
			cur.t.writes = append(cur.t.writes, t)
		}
		cur.ops, cur.at = append(cur.ops, op), append(cur.at, k)
		if op.Removes() && !slices.Contains(cur.t.probes, t) {
			cur.t.probes = append(cur.t.probes, t)
		}
	}
	return txns, nil
}

// logOffsets returns the logs of the run's locks with the entries replayed
// so far, for the publish.
func (x *execution[T]) logOffsets() []run.LogOffset {
	out := make([]run.LogOffset, len(x.locks))
	for i, l := range x.locks {
		o := x.r.owners[i]
		out[i] = run.LogOffset{Key: keys.LogKey(l.Key), Offset: x.offsets[i], Work: x.work[i],
			Logged: x.logs.Highest(i), Owner: o.key, Family: o.family}
	}
	return out
}
