package rebuild

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/redis/rueidis"
)

// catchUpChunk is the most entries a catch-up reads from one log per round
// trip: a readlog script of this many entries takes well under a
// millisecond of the server's time.
const catchUpChunk = 4000

// catchUpWork bounds the work (ops and arguments) a catch-up replays per
// round trip, over every log, so that entries of many ops each do not make
// one round trip of hundreds of megabytes: past it, a log's next read takes
// fewer entries. Every log replays at least one entry per round trip.
//
// It also keeps a round trip about the size of a batch's (a few thousand
// commands): rueidis takes a connection whose round trip in flight has not
// returned within its ConnWriteTimeout (10 s by default) for a dead one,
// and closes it under the write ("use of closed network connection"),
// which fails the run. 100,000 made round trips of 33,000 commands, which
// took over 10 s under -race on a loaded 2-core machine.
const catchUpWork = 10_000

// catchUpScope is what a catch-up uses of its run: it is set once, when the
// run starts.
type catchUpScope struct {
	redis     *protocol.Redis
	key       string   // the builders' keys, for errors
	lives     []string // the builders' keys, one per lock
	owners    []owner  // one per lock
	targets   *targets
	batchSize int           // Options.BatchSize
	timeout   time.Duration // Options.CatchUpTimeout, for errors
	// exact makes a catch-up replay every entry, leaving no tail: in
	// Generations mode across slots the flip cannot replay one, and
	// refuses while a log holds one (the run cuts over: publisher.cutOver).
	exact bool
	// write writes the transactions of a round as the batches' are, with
	// the lease's lock of the temp keys held.
	write func(context.Context, []*txn) error
}

// catchUp is the catch-up of a run: it replays the changes applied during
// the run (see Apply) from each lock's log onto the temp keys, and keeps
// how far it got, for the publish (logOffsets) and the heartbeats (counts,
// heard). Only run writes offsets, work and chunks.
type catchUp struct {
	catchUpScope
	locks    []*protocol.Lock
	offsets  []int64        // per lock, the entries of its log of changes replayed
	work     []int64        // per lock, the work (ops and arguments) of those entries
	chunks   []int64        // per lock, the entries the next read takes
	logs     *protocol.Logs // the counts of the logs seen
	replayed atomic.Int64   // changes replayed
	logged   atomic.Int64   // changes logged for the run, as the last heartbeat read
}

// newCatchUp returns the catch-up of a run of scope that holds locks,
// nothing replayed yet.
func newCatchUp(scope catchUpScope, locks []*protocol.Lock) *catchUp {
	c := &catchUp{
		catchUpScope: scope, locks: locks,
		offsets: make([]int64, len(locks)),
		work:    make([]int64, len(locks)),
		chunks:  make([]int64, len(locks)),
	}
	for i := range c.chunks {
		c.chunks[i] = catchUpChunk
	}
	logKeys := make([]string, len(locks))
	for i, l := range locks {
		logKeys[i] = keys.LogKey(l.Key)
	}
	c.logs = protocol.NewLogs(logKeys)
	return c
}

// counts returns the changes logged for the run, as the last heartbeat
// read, and those replayed so far.
func (c *catchUp) counts() (logged, replayed int64) {
	return c.logged.Load(), c.replayed.Load()
}

// heard checks the counts of the logs a heartbeat read, one per lock,
// calling fail with the error of each that is wrong, and keeps their sum.
func (c *catchUp) heard(counts []protocol.LogCount, fail func(error)) {
	var logged int64
	for i, n := range counts {
		logged += n.Logged
		if err := c.logs.Check(i, n); err != nil {
			fail(err)
		}
	}
	c.logged.Store(logged)
}

// replayGroup is the ops of a round of a catch-up on one key, in the order
// logged.
type replayGroup struct {
	t   *target
	ops []protocol.Op
}

// replayRound is the ops of a round of a catch-up, grouped by the temp key
// they write: ops on different keys commute, so each key's go together,
// which makes fewer commands (protocol.ReplayCommands).
type replayRound struct {
	groups []replayGroup
	index  map[*target]int
}

// catchUpRound is what one round of a catch-up read: its transactions, and
// the entries they replay.
type catchUpRound struct {
	txns []*txn
	read int64
}

// run replays the changes applied during the run (see Apply) onto the
// temp keys, from each lock's log, until what is left is short enough for
// the publish to replay: at most PublishTail entries, of at most
// PublishTailWork ops and arguments; with exact (Generations mode, whose
// temp keys are the keys of the run's generation), until nothing is left
// that it saw logged. It returns an error matching
// ErrFallingBehind once deadline has passed with more left, or when a log
// reached its bound.
//
// The logs are input from other processes. Each round trip reads, per log
// (protocol.ReadLogCommands), the log's length and the counts Apply keeps in the
// lock's record, with the record's token, in one script, then the next
// entries, of those counted: a record gone
// lost its counts (ErrWritesLost), one of another token is forged
// (ErrTampered); a log shorter than its count lost changes
// (ErrWritesLost), a longer one holds entries nobody counted
// (ErrTampered). Every entry must be a change of its builder's keys
// (ErrTampered otherwise, naming the log, the entry and the key). The
// entries are written as transactions like the batches', which advance the
// run's record, so that the publish can tell whether Redis lost any of
// them: the ops of each transaction grouped by key, runs of one command
// merged into one (protocol.ReplayCommands). The write of one round is in
// flight while the next round is read and checked; catchUp returns once
// every write it sent has returned, so that a failure's cleanup comes after
// them.
func (c *catchUp) run(ctx context.Context, deadline time.Time) (err error) {
	var pending chan error // the write in flight, if any
	var inFlight int64     // the entries it replays
	wait := func() error {
		if pending == nil {
			return nil
		}
		err := <-pending
		pending = nil
		if err == nil {
			c.replayed.Add(inFlight)
		}
		return err
	}
	defer func() {
		if werr := wait(); err == nil {
			err = werr
		}
	}()
	for {
		rd, behind, work, err := c.read(ctx)
		if err != nil {
			return err
		}
		if err := wait(); err != nil {
			return err
		}
		done := behind <= PublishTail && work <= PublishTailWork
		if c.exact {
			done = behind == 0
		}
		if len(rd.txns) > 0 {
			ch := make(chan error, 1)
			txns := rd.txns
			go func() { ch <- c.write(ctx, txns) }()
			pending, inFlight = ch, rd.read
		} else {
			c.replayed.Add(rd.read)
		}
		switch {
		case done:
			return wait()
		case time.Now().After(deadline):
			if err := wait(); err != nil {
				return err
			}
			return &Error{Op: "catch-up", Key: c.key, Err: fmt.Errorf("%w: %d changes (%d ops and arguments) still to replay after catching up for %v (Options.CatchUpTimeout): they arrive faster than the run replays them; every live key left unchanged (and holds every change)", ErrFallingBehind, behind, work, c.timeout)}
		case ctx.Err() != nil:
			return wait() // run reports the cause
		}
	}
}

// read reads and checks the next entries of every log, and returns
// them as transactions, with what is left behind them in the logs: entries
// and their work.
func (c *catchUp) read(ctx context.Context) (rd catchUpRound, behind, work int64, err error) {
	cb := c.redis.Client().B()
	cmds := make(rueidis.Commands, 0, 2*len(c.locks))
	for i, l := range c.locks {
		script, lrange := protocol.ReadLogCommands(cb, keys.LogKey(l.Key), keys.RecordKey(l.Key), c.offsets[i], c.offsets[i]+c.chunks[i]-1)
		cmds = append(cmds, script, lrange)
	}
	seen := c.logs.Seen() // before the read: see protocol.Logs.Seen
	res := c.redis.Client().DoMulti(ctx, cmds...)
	round := replayRound{index: map[*target]int{}}
	var roundWork int64
	// The ops of the entry being decoded (replay copies them), and the
	// arguments of every op of the round.
	var ops []protocol.Op
	var args []string
	for i, l := range c.locks {
		log := keys.LogKey(l.Key)
		entries, count, counted, token, err := protocol.ReadLogReply(res[2*i], res[2*i+1], c.offsets[i])
		if err != nil {
			if perr := protocol.Refused(err); perr != nil {
				err = perr
			}
			return rd, 0, 0, protocol.Fail(ctx, "catch-up", c.key, fmt.Errorf("reading %s: %w", log, err))
		}
		// The counts are the record's: one gone (evicted) lost them,
		// one forged is not the run's.
		if token != l.Token {
			return rd, 0, 0, &Error{Op: "catch-up", Key: c.lives[i], Err: protocol.RecordError(keys.RecordKey(l.Key), token != "")}
		}
		count.Seen = seen[i]
		if err := c.logs.Check(i, count); err != nil {
			return rd, 0, 0, &Error{Op: "catch-up", Key: c.lives[i], Err: err}
		}
		o := c.owners[i]
		checked := protocol.LogOffset{Key: log, Owner: o.key, Family: o.family}
		taken := len(entries)
		for j, e := range entries {
			if j > 0 && roundWork >= catchUpWork {
				taken = j // the rest is read again next round
				break
			}
			index := c.offsets[i] + int64(j)
			var err error
			ops, args, err = protocol.AppendEntry(ops[:0], args, e)
			if errors.Is(err, ErrFallingBehind) {
				return rd, 0, 0, &Error{Op: "catch-up", Key: c.lives[i], Err: fmt.Errorf("%w: %s reached its bound of changes (Options.MaxChanges of the Rebuilder that applies them), so later changes were not logged; every live key left unchanged (and holds every change)", ErrFallingBehind, log)}
			}
			if err != nil {
				return rd, 0, 0, &Error{Op: "catch-up", Key: c.lives[i], Err: protocol.BadEntry(log, index, err)}
			}
			if err := c.replay(&round, i, checked, index, ops); err != nil {
				return rd, 0, 0, err
			}
			for _, op := range ops {
				c.work[i] += op.Work()
				roundWork += op.Work()
			}
		}
		if taken < len(entries) {
			c.chunks[i] = int64(max(1, taken))
		} else {
			c.chunks[i] = min(catchUpChunk, 2*c.chunks[i])
		}
		c.offsets[i] += int64(taken)
		rd.read += int64(taken)
		behind += max(0, count.Len-c.offsets[i])
		work += max(0, counted-c.work[i])
	}
	rd.txns = c.replayTxns(cb, round.groups)
	return rd, behind, work, nil
}

// replay adds ops, entry index of log, the log of lock i, to round, each op in
// the group of its key. An op on a key that is not builder i's fails the
// run with ErrTampered, naming the log, the entry and the key: Apply logs
// no such op.
func (c *catchUp) replay(round *replayRound, i int, log protocol.LogOffset, index int64, ops []protocol.Op) error {
	if err := protocol.CheckEntry(log, index, ops); err != nil {
		return &Error{Op: "catch-up", Key: c.lives[i], Err: err}
	}
	for _, op := range ops {
		t, err := c.targets.get(i, op.Key)
		if errors.Is(err, ErrTooManyKeys) {
			return &Error{Op: "catch-up", Key: c.lives[i], Err: fmt.Errorf("the changes applied during the run add keys past the bound: %w", err)}
		}
		if err != nil {
			return &Error{Op: "catch-up", Key: c.lives[i], Err: err}
		}
		k, ok := round.index[t]
		if !ok {
			k = len(round.groups)
			round.index[t] = k
			round.groups = append(round.groups, replayGroup{t: t})
		}
		round.groups[k].ops = append(round.groups[k].ops, op)
	}
	return nil
}

// replayTxns returns the groups of a round as transactions of at most
// BatchSize ops, each key's ops in order: a key of more ops than that is
// split over consecutive transactions, which the round's DoMulti sends in
// order.
func (c *catchUp) replayTxns(cb rueidis.Builder, groups []replayGroup) []*txn {
	size := c.batchSize
	var txns []*txn
	var cur *txn
	ops := 0
	for _, g := range groups {
		for len(g.ops) > 0 {
			if cur == nil || ops >= size {
				cur, ops = &txn{label: "replayed changes"}, 0
				txns = append(txns, cur)
			}
			part := g.ops[:min(len(g.ops), size-ops)]
			g.ops = g.ops[len(part):]
			ops += len(part)
			cur.writes = append(cur.writes, g.t)
			if slices.ContainsFunc(part, protocol.Op.Removes) {
				cur.probes = append(cur.probes, g.t)
			}
			cur.cmds = protocol.ReplayCommands(cb, cur.cmds, g.t.Key, part)
		}
	}
	for _, t := range txns {
		expiring(t)
	}
	return txns
}

// logOffsets returns the logs of the run's locks with the entries replayed
// so far, for the publish.
func (c *catchUp) logOffsets() []protocol.LogOffset {
	out := make([]protocol.LogOffset, len(c.locks))
	for i, l := range c.locks {
		o := c.owners[i]
		out[i] = protocol.LogOffset{Key: keys.LogKey(l.Key), Offset: c.offsets[i], Work: c.work[i],
			Logged: c.logs.Highest(i), Owner: o.key, Family: o.family}
	}
	return out
}
