package rebuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
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
//     the size of a family. It runs in a goroutine of its own, so that a
//     family's many chunks never hold a heartbeat back, and it stops
//     between two chunks once the lease ends.
//
// A temp key's deadline is never earlier than its lock's: every temp key
// was renewed, to the temp keys' TTL, at or after the start of the last
// complete refresh, and a heartbeat, which gives the locks TTL, is not sent
// once that start is more than the temp keys' TTL minus TTL ago. A refresh
// of many keys takes long: when the last one took so long that heartbeats
// would have to wait (the temp keys' TTL is less than TTL + TTL/3 + twice
// the refresh's time), the temp keys' TTL grows to cover it, and the run
// logs that it did, rather than let its lease lapse.
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

	// tempSecs is the temp keys' TTL, in seconds: 2×TTL, or longer when a
	// refresh takes long (see refreshed). The batches' EXPIRE NX reads it
	// too.
	tempSecs *atomic.Int64
	log      *slog.Logger

	// temps is held by a refresh, from its snapshot of the temp keys to its
	// check of what it found, and by a catch-up's write, which may empty
	// temp keys: a refresh must not take a key emptied by a replayed change
	// for a lost one.
	temps sync.Mutex

	mu       sync.Mutex
	lastBeat time.Time // when the last successful heartbeat was sent
	// renewed is when the last complete refresh started, and renewedTTL the
	// TTL it gave: every temp key lives until renewed + renewedTTL at least.
	renewed    time.Time
	renewedTTL time.Duration
	lastSend   time.Time // when a batch last went out
	inFlight   bool
	watchdog   *time.Timer
	stopped    bool
	stop       chan struct{}
}

// heartbeatEvery is how often the heartbeat renews a run of lease ttl.
func heartbeatEvery(ttl time.Duration) time.Duration { return min(time.Second, ttl/3) }

// newLease starts the lease of locks acquired at (or after) start: the
// temp keys, written since, live until start plus their TTL at least.
func newLease(x leaseOwner, start time.Time) *lease {
	l := &lease{
		redis: x.redis, locks: x.locks, targets: x.targets, ttl: x.ttl, key: x.key, cancel: x.cancel,
		acked: x.acked, status: x.status, control: x.control, stall: x.stall, tempSecs: x.tempSecs, log: x.log,
		lastBeat: start, renewed: start, renewedTTL: time.Duration(x.tempSecs.Load()) * time.Second, stop: make(chan struct{}),
	}
	l.watchdog = time.AfterFunc(time.Until(start.Add(l.ttl)), l.lapse)
	return l
}

// resume returns a new lease of l's run, after l ended for a publish that
// did not happen: it goes on from l's last heartbeat and refresh.
func (l *lease) resume(x leaseOwner) *lease {
	l.mu.Lock()
	beat, renewed, renewedTTL := l.lastBeat, l.renewed, l.renewedTTL
	l.mu.Unlock()
	n := newLease(x, beat)
	n.renewed, n.renewedTTL = renewed, renewedTTL
	return n
}

// leaseOwner is what a lease needs of its run.
type leaseOwner struct {
	redis    *run.Redis
	locks    []*run.Lock
	targets  *targets
	ttl      time.Duration
	key      string
	cancel   context.CancelCauseFunc
	acked    func() int64
	status   func() []string
	control  func(run.Control)
	stall    *stallWatch
	tempSecs *atomic.Int64
	log      *slog.Logger
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
	// A heartbeat gives the locks TTL from now: not past what the last
	// complete refresh gave the temp keys.
	if l.stopped || l.inFlight || now.Sub(l.lastBeat) < every || now.Add(l.ttl).After(l.renewed.Add(l.renewedTTL)) ||
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
	started := time.Now()
	ttl := time.Duration(l.tempSecs.Load()) * time.Second
	snap := run.Snap(l.targets.temps())
	states, err := l.redis.Refresh(ctx, l.locks[0], snap.Keys(), ttl)
	switch {
	case errors.Is(err, ErrLockLost):
		l.cancel(err)
	case err != nil:
		// Not fatal yet: the next refresh may succeed; a heartbeat waits
		// for one that does (see claim). A refresh the lease's end stopped
		// is over.
	default:
		l.refreshed(started, time.Now(), ttl)
		if err := snap.Check(states, "during the run"); err != nil {
			l.cancel(&Error{Op: "lease", Key: l.key, Err: err})
		}
	}
}

// refreshed records a complete refresh, from started to ended, that gave
// the temp keys ttl; and, if it took so long that heartbeats would have to
// wait for the next one, makes the temp keys' TTL long enough. Between the
// starts of two refreshes pass TTL/3 and the first's time; a heartbeat
// needs every temp key to outlive the locks it extends by TTL.
func (l *lease) refreshed(started, ended time.Time, ttl time.Duration) {
	l.mu.Lock()
	l.renewed, l.renewedTTL = started, ttl
	l.mu.Unlock()
	took := ended.Sub(started)
	need := l.ttl + l.ttl/3 + 2*took + time.Second
	secs := int64((need + time.Second - 1) / time.Second)
	if old := l.tempSecs.Load(); secs > old && l.tempSecs.CompareAndSwap(old, secs) {
		l.log.Warn("keyswap: refreshing the temp keys takes long for the lease (Options.TTL); their TTL grows to cover it",
			"key", l.key, "temp_keys", l.targets.count(), "refresh", took, "ttl", l.ttl, "temp_ttl", time.Duration(secs)*time.Second)
	}
}

// run sends the heartbeats no batch carried and watches the source for a
// stall, and refreshes the temp keys every TTL/3 in a goroutine of its
// own, until ctx is done or the lease is stopped. It returns once the
// refresh has stopped too.
func (l *lease) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var refreshing sync.WaitGroup
	defer refreshing.Wait()
	refreshing.Go(func() {
		every := max(l.ttl/3, time.Millisecond)
		for {
			select {
			case <-ctx.Done():
				return
			case <-l.stop:
				return
			case <-time.After(every):
			}
			l.refresh(ctx)
		}
	})
	beat := time.NewTicker(max(heartbeatEvery(l.ttl)/2, time.Millisecond))
	defer beat.Stop()
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
