package protocol

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// ErrNotDurable reports that the writes of a rebuild could not be made as
// durable as asked before the publish: fewer replicas acknowledged them, or
// fewer fsynced them to their AOF, within the timeout. Nothing was
// published.
var ErrNotDurable = errors.New("the rebuild's writes could not be made durable")

// Durability is how durable a run's writes must be before they are
// published.
type Durability struct {
	// Replicas is how many replicas must have acknowledged every write
	// (WAIT).
	Replicas int
	// LocalAOF makes the master fsync every write to its AOF (WAITAOF,
	// Redis 7.2 or later, with appendonly yes).
	LocalAOF bool
	// ReplicasAOF is how many replicas must have fsynced every write to
	// their AOF (WAITAOF, Redis 7.2 or later).
	ReplicasAOF int
	// Timeout bounds the wait.
	Timeout time.Duration
}

// needsWaitAOF reports whether d needs WAITAOF.
func (d Durability) needsWaitAOF() bool { return d.LocalAOF || d.ReplicasAOF > 0 }

// none reports whether d asks for nothing.
func (d Durability) none() bool { return d.Replicas == 0 && !d.needsWaitAOF() }

// CheckDurable finds out, before a run writes anything, whether the server
// can give what d asks: WAITAOF exists only from Redis 7.2, and local AOF
// fsyncs need appendonly yes. It returns an error saying what is missing.
func (r Durable) CheckDurable(ctx context.Context, op, key string, lock string, d Durability) error {
	if d.none() {
		return nil
	}
	// WAIT and WAITAOF, blocking commands, need a connection of the
	// client's blocking pool: taken as the wait's is (see waitOn), and
	// answered within the timeout, should the application keep the pool
	// in use or the server not answer.
	return r.waitOn(ctx, op, key, keys.RecordKey(lock), d.Timeout, nil, func(probe context.Context, c rueidis.DedicatedClient) error {
		late := func(cmd string, err error) error {
			if errors.Is(context.Cause(probe), errNoConnection) {
				return &Error{Op: op, Key: key, Err: fmt.Errorf("%w: %s did not answer within %v", ErrNotDurable, cmd, d.Timeout)}
			}
			return fmt.Errorf("%s: %w", cmd, err)
		}
		if d.Replicas > 0 && !d.needsWaitAOF() {
			// WAIT 0 returns at once: it only asks whether this user may
			// run it.
			err := c.Do(probe, c.B().Wait().Numreplicas(0).Timeout(1).Build()).Error()
			if perr := Refused(err); perr != nil {
				return &Error{Op: op, Key: key, Err: fmt.Errorf("Durability asks for replicas, which needs WAIT: %w", perr)}
			}
			if err != nil {
				return late("WAIT", err)
			}
		}
		if !d.needsWaitAOF() {
			return nil
		}
		err := c.Do(probe, c.B().Waitaof().Numlocal(0).Numreplicas(0).Timeout(1).Build()).Error()
		if perr := Refused(err); perr != nil {
			return &Error{Op: op, Key: key, Err: fmt.Errorf("Durability asks for AOF fsyncs, which needs WAITAOF: %w", perr)}
		}
		if rerr, ok := rueidis.IsRedisErr(err); ok && strings.Contains(strings.ToLower(rerr.Error()), "unknown command") {
			return &Error{Op: op, Key: key, Err: fmt.Errorf("%w: Durability asks for AOF fsyncs, which need WAITAOF (Redis 7.2 or later), and this server does not have it: %w", ErrNotDurable, err)}
		}
		if err != nil {
			return late("WAITAOF", err)
		}
		if !d.LocalAOF {
			return nil
		}
		// WAITAOF 1 0 fails at once when appendonly is off; after a write,
		// so that it has one to wait for.
		record := keys.RecordKey(lock)
		if err := c.Do(probe, c.B().Hincrby().Key(record).Field("waits").Increment(1).Build()).Error(); err != nil {
			return late("HINCRBY "+record, err)
		}
		return c.Do(probe, c.B().Waitaof().Numlocal(1).Numreplicas(0).Timeout(1).Build()).Error()
	})
}

// Wait makes the run's writes as durable as d asks, or returns an error
// matching [ErrNotDurable]. lock is the run's first lock key: the wait is
// sent to the master that holds it, on a connection of its own that first
// writes to the run's record, so that WAIT and WAITAOF cover every write the
// run made before, on any connection: the server counts from the offset of
// the connection's last write, and its replication stream is in order.
func (r Durable) Wait(ctx context.Context, op, key, lock string, d Durability) error {
	record := keys.RecordKey(lock)
	return r.wait(ctx, op, key, record, func(b rueidis.Builder) rueidis.Completed {
		return b.Hincrby().Key(record).Field("waits").Increment(1).Build()
	}, d)
}

// WaitAt is Wait on the master that holds the key at, which the run wrote
// there: touch, a write of at that Redis propagates to the replicas, is
// the write the wait counts from. A run whose writes spread over the
// masters of a cluster waits on each of them: WAIT and WAITAOF only count
// the writes of the master they run on.
func (r Durable) WaitAt(ctx context.Context, op, key, at string, touch func(b rueidis.Builder) rueidis.Completed, d Durability) error {
	return r.wait(ctx, op, key, at, touch, d)
}

// wait is Wait and WaitAt: on the master of bind, after the write touch.
func (r Durable) wait(ctx context.Context, op, key, bind string, touch func(b rueidis.Builder) rueidis.Completed, d Durability) error {
	if d.none() {
		return nil
	}
	ms := d.Timeout.Milliseconds()
	// The waits have a timeout of their own, the same: under ctx, a reply
	// that comes just after it is not cut off.
	return r.waitOn(ctx, op, key, bind, d.Timeout, touch, func(_ context.Context, c rueidis.DedicatedClient) error {
		if d.Replicas > 0 {
			n, err := c.Do(ctx, c.B().Wait().Numreplicas(int64(d.Replicas)).Timeout(ms).Build()).AsInt64()
			if err != nil {
				return fmt.Errorf("WAIT: %w", err)
			}
			if n < int64(d.Replicas) {
				return fmt.Errorf("%w: %d of %d replicas acknowledged the writes within %v (WAIT)", ErrNotDurable, n, d.Replicas, d.Timeout)
			}
		}
		if d.needsWaitAOF() {
			local := int64(0)
			if d.LocalAOF {
				local = 1
			}
			got, err := c.Do(ctx, c.B().Waitaof().Numlocal(local).Numreplicas(int64(d.ReplicasAOF)).Timeout(ms).Build()).AsIntSlice()
			if err != nil {
				return fmt.Errorf("WAITAOF: %w", err)
			}
			if len(got) != 2 || got[0] < local || got[1] < int64(d.ReplicasAOF) {
				return fmt.Errorf("%w: WAITAOF answered %v within %v, want at least [%d %d] (the master's fsync, then the replicas')", ErrNotDurable, got, d.Timeout, local, d.ReplicasAOF)
			}
		}
		return nil
	})
}

// waitOn runs wait on a dedicated connection to the master of bind, after
// the write touch on it when touch is not nil, with a context that
// ends within after waitOn started. The connection must come by then, as
// the wait itself must end; a cancelled ctx (an operator's cancel, read by
// the heartbeats, which go on meanwhile) ends the wait.
//
// The connection's first command, an EXISTS of bind, binds a
// cluster connection to the master of bind: a cluster client takes the
// connection from the pool for it. It is not cut short when the connection
// does not come in time (see TakeConnection): the run gives up on it, and it is
// given back once it comes. So it only reads; the write that the wait
// counts from comes once the connection is there.
func (r Durable) waitOn(ctx context.Context, op, key, bind string, within time.Duration, touch func(b rueidis.Builder) rueidis.Completed, wait func(bounded context.Context, c rueidis.DedicatedClient) error) error {
	actx, cancel := context.WithTimeoutCause(ctx, within, errNoConnection)
	defer cancel()
	got := TakeConnection(ctx, r.client, func(never context.Context, c rueidis.DedicatedClient) error {
		return c.Do(never, c.B().Exists().Key(bind).Build()).Error()
	})
	var d Dedicated
	select {
	case d = <-got:
	case <-actx.Done():
		Abandon(got)
		if errors.Is(context.Cause(actx), errNoConnection) {
			return &Error{Op: op, Key: key, Err: fmt.Errorf("%w: %w within %v", ErrNotDurable, errNoConnection, within)}
		}
		return Fail(ctx, op, key, ctx.Err())
	}
	defer d.Release()
	if d.Err != nil {
		return Fail(ctx, op, key, fmt.Errorf("EXISTS %s: %w", bind, d.Err))
	}
	late := func(cmd string) error {
		if errors.Is(context.Cause(actx), errNoConnection) {
			return &Error{Op: op, Key: key, Err: fmt.Errorf("%w: %s did not answer within %v", ErrNotDurable, cmd, within)}
		}
		return nil
	}
	if touch != nil {
		cmd := touch(d.Client.B())
		name := strings.Join(cmd.Commands()[:min(2, len(cmd.Commands()))], " ")
		if err := d.Client.Do(actx, cmd).Error(); err != nil {
			if lerr := late(name); lerr != nil {
				return lerr
			}
			return Fail(ctx, op, key, fmt.Errorf("%s: %w", name, err))
		}
	}
	if err := wait(actx, d.Client); err != nil {
		var kerr *Error
		if errors.As(err, &kerr) {
			return err
		}
		return Fail(ctx, op, key, err)
	}
	return nil
}

// errNoConnection is why a durability wait did not start.
var errNoConnection = errors.New("no connection of the client's blocking pool (rueidis ClientOption.BlockingPoolSize) came free to wait on")
