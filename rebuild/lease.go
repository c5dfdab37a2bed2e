package rebuild

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/keyswap/keyswap/internal/run"
	"github.com/redis/rueidis"
)

// The renewal policy, in one place.
//
// A run's locks live for TTL, its temp keys for twice that. Two renewals
// keep them alive:
//
//   - The heartbeat, every heartbeatEvery (a second, or TTL/3 if that is
//     shorter): one script that checks every lock still holds the run's
//     token, checks that the run's record holds every batch Redis
//     acknowledged, resets the locks' TTL, writes the run's status, and
//     reads what an operator asked. It rides in the round trip of the next
//     batch, at no extra cost; it goes alone only when no batch was sent for
//     half a heartbeat period.
//   - The refresh, every TTL/3: the temp keys' TTL reset to 2×TTL, at most
//     run.RefreshChunk keys per script, one script after the other, so that
//     no renewal blocks Redis for longer than a few milliseconds, whatever
//     the size of a family.
//
// A temp key's deadline is thus never earlier than its lock's: it was reset
// at most TTL/3 ago to 2×TTL, the lock at most now to TTL. A heartbeat is
// not sent when the last refresh ended more than TTL ago, so that this holds
// even when refreshes stall.
//
// The run ends when:
//   - no heartbeat reaches Redis for a whole TTL (the process or the network
//     stalled): the locks have expired there, and the watchdog cancels the
//     run with ErrLockLost;
//   - a heartbeat finds a lock that is not ours (ErrLockLost), a record
//     that lost batches (ErrWritesLost), or an operator's cancel
//     (ErrAborted); or a refresh finds a temp key lost (ErrTempKeyLost);
//   - the source yields no item for Options.StallTimeout while the run is
//     not paused (ErrStalled): a stalled source must not hold the locks
//     forever.
type lease struct {
	redis   *run.Redis
	locks   []*run.Lock
	targets *targets
	ttl     time.Duration
	key     string // the builders' keys, for errors
	cancel  context.CancelCauseFunc
	acked   func() int64    // batches Redis acknowledged
	status  func() []string // the run's status, for the record
	control func(run.Control)
	stall   *stallWatch

	// temps is held by a refresh, from its snapshot of the temp keys to its
	// check of what it found, and by a catch-up's write, which may empty
	// temp keys: a refresh must not take a key emptied by a replayed change
	// for a lost one.
	temps sync.Mutex

	mu          sync.Mutex
	lastBeat    time.Time // when the last successful heartbeat was sent
	lastRefresh time.Time // when the last complete refresh ended
	lastSend    time.Time // when a batch last went out
	inFlight    bool
	watchdog    *time.Timer
	stopped     bool
	stop        chan struct{}
}

// heartbeatEvery is how often the heartbeat renews a run of lease ttl.
func heartbeatEvery(ttl time.Duration) time.Duration { return min(time.Second, ttl/3) }

// newLease starts the lease of locks acquired at (or after) start.
func newLease(x leaseOwner, start time.Time) *lease {
	l := &lease{
		redis: x.redis, locks: x.locks, targets: x.targets, ttl: x.ttl, key: x.key, cancel: x.cancel,
		acked: x.acked, status: x.status, control: x.control, stall: x.stall,
		lastBeat: start, lastRefresh: start, stop: make(chan struct{}),
	}
	l.watchdog = time.AfterFunc(time.Until(start.Add(l.ttl)), l.lapse)
	return l
}

// resume returns a new lease of l's run, after l ended for a publish that
// did not happen: it goes on from l's last heartbeat and refresh.
func (l *lease) resume(x leaseOwner) *lease {
	l.mu.Lock()
	beat, refresh := l.lastBeat, l.lastRefresh
	l.mu.Unlock()
	n := newLease(x, beat)
	n.lastRefresh = refresh
	return n
}

// leaseOwner is what a lease needs of its run.
type leaseOwner struct {
	redis   *run.Redis
	locks   []*run.Lock
	targets *targets
	ttl     time.Duration
	key     string
	cancel  context.CancelCauseFunc
	acked   func() int64
	status  func() []string
	control func(run.Control)
	stall   *stallWatch
}

// lapsed reports whether no heartbeat has reached Redis for a whole TTL by
// now: the locks have expired there, whether or not the watchdog has run
// yet (a loaded machine can run it late).
func (l *lease) lapsed(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return now.Sub(l.lastBeat) >= l.ttl
}

// lapse cancels the run: no heartbeat reached Redis within TTL, so the
// locks have expired there, or are about to.
func (l *lease) lapse() { l.cancel(l.lapseError()) }

// lapseError is the error of a lapsed lease.
func (l *lease) lapseError() error {
	return &Error{Op: "lease", Key: l.key, Err: fmt.Errorf("%w: no heartbeat reached Redis for a whole TTL (%v): the process or the network stalled", ErrLockLost, l.ttl)}
}

// claim reserves the next heartbeat if one is due and none is in flight:
// for a batch's round trip (alone false), or to send alone when no batch
// went out for half a heartbeat period.
func (l *lease) claim(now time.Time, alone bool) (run.Heartbeat, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	every := heartbeatEvery(l.ttl)
	if !alone {
		l.lastSend = now
	}
	if l.stopped || l.inFlight || now.Sub(l.lastBeat) < every || now.Sub(l.lastRefresh) > l.ttl ||
		alone && now.Sub(l.lastSend) < every/2 {
		return run.Heartbeat{}, false
	}
	l.inFlight = true
	return run.Heartbeat{Locks: l.locks, Acked: l.acked(), Status: l.status()}, true
}

// command returns h as a command for a batch's DoMulti.
func (l *lease) command(h run.Heartbeat) (rueidis.Completed, error) {
	return l.redis.BeatCommand(h)
}

// settle records the reply of heartbeat h, claimed and sent at sent. reply
// is the reply to command, or nil when h was sent alone.
func (l *lease) settle(ctx context.Context, sent time.Time, h run.Heartbeat, reply *rueidis.RedisResult) {
	var c run.Control
	var err error
	if reply != nil {
		c, err = l.redis.BeatReply(ctx, h, *reply)
	} else {
		c, err = l.redis.Beat(ctx, h)
	}
	l.mu.Lock()
	l.inFlight = false
	if err == nil {
		l.lastBeat = sent
		if !l.stopped {
			l.watchdog.Reset(time.Until(sent.Add(l.ttl)))
		}
	}
	l.mu.Unlock()
	switch {
	case err == nil:
		l.control(c)
	case errors.Is(err, ErrLockLost), errors.Is(err, ErrWritesLost):
		l.cancel(err)
	case run.Refused(err) != nil:
		// Rights do not come back by themselves: fail now, saying which,
		// rather than at the end of the lease as a stall.
		l.cancel(&Error{Op: "lease", Key: l.key, Err: run.Refused(err)})
	}
	// Other failures (a timeout, a dropped connection) are not fatal yet:
	// the next heartbeat may succeed, and if none does within TTL the
	// watchdog ends the run.
}

// refresh renews every temp key's TTL, in chunks, and checks what it finds.
func (l *lease) refresh(ctx context.Context) {
	l.temps.Lock()
	defer l.temps.Unlock()
	snap := run.Snap(l.targets.temps())
	states, err := l.redis.Refresh(ctx, l.locks[0], snap.Keys(), 2*l.ttl)
	switch {
	case errors.Is(err, ErrLockLost):
		l.cancel(err)
	case err != nil:
		// Not fatal yet: the next refresh may succeed; a heartbeat waits
		// for one that does (see claim).
	default:
		l.mu.Lock()
		l.lastRefresh = time.Now()
		l.mu.Unlock()
		if err := snap.Check(states, "during the run"); err != nil {
			l.cancel(&Error{Op: "lease", Key: l.key, Err: err})
		}
	}
}

// run sends the heartbeats no batch carried, refreshes the temp keys every
// TTL/3, and watches the source for a stall, until ctx is done or the lease
// is stopped.
func (l *lease) run(ctx context.Context) {
	beat := time.NewTicker(max(heartbeatEvery(l.ttl)/2, time.Millisecond))
	defer beat.Stop()
	refresh := time.NewTicker(max(l.ttl/3, time.Millisecond))
	defer refresh.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.stop:
			return
		case now := <-beat.C:
			if err := l.stall.check(now); err != nil {
				l.cancel(&Error{Op: "source", Key: l.key, Err: err})
			}
			if h, ok := l.claim(now, true); ok {
				l.settle(ctx, now, h, nil)
			}
		case <-refresh.C:
			l.refresh(ctx)
		}
	}
}

// end stops heartbeats, refreshes and the watchdog, before the publish.
func (l *lease) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stopped {
		l.stopped = true
		l.watchdog.Stop()
		close(l.stop)
	}
}
