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

// catchUp replays the changes applied during the run (see Apply) onto the
// temp keys, from each lock's log, until what is left is short enough for
// the publish to replay: at most PublishTail entries. It returns an error
// matching ErrFallingBehind once deadline has passed with more left, or
// when a log reached its bound.
//
// Each round trip reads the next entries of every log, and writes the
// previous ones: as transactions like the batches', which advance the
// run's record, so that the publish can tell whether Redis lost any of
// them.
func (x *execution[T]) catchUp(ctx context.Context, deadline time.Time) error {
	r := x.r
	cb := r.redis.Client().B()
	for {
		cmds := make(rueidis.Commands, 0, 2*len(x.locks))
		for i, l := range x.locks {
			log := keys.LogKey(l.Key)
			cmds = append(cmds, cb.Lrange().Key(log).Start(x.offsets[i]).Stop(x.offsets[i]+catchUpChunk-1).Build(),
				cb.Llen().Key(log).Build())
		}
		res := r.redis.Client().DoMulti(ctx, cmds...)
		var txns []*txn
		var read, behind int64
		for i, l := range x.locks {
			entries, err := res[2*i].AsStrSlice()
			if err == nil {
				var n int64
				n, err = res[2*i+1].AsInt64()
				behind += max(0, n-x.offsets[i]-int64(len(entries)))
			}
			if err != nil {
				return run.Fail(ctx, "catch-up", r.key, fmt.Errorf("reading %s: %w", keys.LogKey(l.Key), err))
			}
			for _, e := range entries {
				ops, err := run.DecodeEntry(e)
				if errors.Is(err, ErrFallingBehind) {
					return &Error{Op: "catch-up", Key: r.lives[i], Err: fmt.Errorf("%w: %s reached its bound of changes (Options.MaxChanges of the Rebuilder that applies them), so later changes were not logged; every live key left unchanged (and holds every change)", ErrFallingBehind, keys.LogKey(l.Key))}
				}
				if err != nil {
					return &Error{Op: "catch-up", Key: r.lives[i], Err: fmt.Errorf("%s: %w", keys.LogKey(l.Key), err)}
				}
				if txns, err = x.replay(txns, i, ops); err != nil {
					return err
				}
			}
			x.offsets[i] += int64(len(entries))
			read += int64(len(entries))
		}
		if len(txns) > 0 {
			for _, t := range txns {
				expiring(t)
			}
			x.lease.temps.Lock()
			err := x.write(ctx, txns)
			x.lease.temps.Unlock()
			if err != nil {
				return err
			}
		}
		x.replayed.Add(read)
		switch {
		case behind <= PublishTail:
			return nil
		case time.Now().After(deadline):
			return &Error{Op: "catch-up", Key: r.key, Err: fmt.Errorf("%w: %d changes still to replay after catching up for %v (Options.CatchUpTimeout): they arrive faster than the run replays them; every live key left unchanged (and holds every change)", ErrFallingBehind, behind, r.opts.CatchUpTimeout)}
		case ctx.Err() != nil:
			return nil // run reports the cause
		}
	}
}

// replay adds ops, from the log of lock i, to txns as writes of builder
// i's temp keys: transactions of at most BatchSize commands.
func (x *execution[T]) replay(txns []*txn, i int, ops []run.Op) ([]*txn, error) {
	cb := x.r.redis.Client().B()
	for _, op := range ops {
		t, err := x.targets.get(i, op.Key)
		if err != nil {
			return nil, &Error{Op: "catch-up", Key: x.r.lives[i], Err: fmt.Errorf("a change applied during the run writes a key this run does not rebuild (does another process apply changes to %q with a different definition?): %w", x.r.lives[i], err)}
		}
		var cur *txn
		if n := len(txns); n > 0 && len(txns[n-1].cmds) < x.r.opts.BatchSize {
			cur = txns[n-1]
		} else {
			cur = &txn{label: "replayed changes"}
			txns = append(txns, cur)
		}
		cur.cmds = append(cur.cmds, cb.Arbitrary(op.Cmd).Keys(t.Key).Args(op.Args...).Build())
		cur.writes = append(cur.writes, t)
		if op.Removes() && !slices.Contains(cur.probes, t) {
			cur.probes = append(cur.probes, t)
		}
	}
	return txns, nil
}

// logOffsets returns the logs of the run's locks with the entries replayed
// so far, for the publish.
func (x *execution[T]) logOffsets() []run.LogOffset {
	out := make([]run.LogOffset, len(x.locks))
	for i, l := range x.locks {
		out[i] = run.LogOffset{Key: keys.LogKey(l.Key), Offset: x.offsets[i]}
	}
	return out
}
