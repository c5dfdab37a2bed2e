package rebuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyswap/keyswap/internal/protocol"
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
//     batch, at no extra cost; it goes alone when no batch was sent for half
//     a heartbeat period, or when the round trip it rides in has not
//     returned after a heartbeat period (a large batch on a slow server: the
//     heartbeat at its end would renew the locks too late).
//   - The refresh, every TTL/3: the temp keys' TTL reset to 2×TTL, at most
//     protocol.RefreshChunk keys per script, one script after the other, so that
//     no renewal blocks Redis for longer than a few milliseconds, whatever
//     the size of a family. It runs in a goroutine of its own, so that a
//     family's many chunks never hold a heartbeat back, and it stops
//     between two chunks once the lease ends.
//
// A heartbeat is not sent once the refresh has made no progress (a chunk
// renewed, or a refresh started) for a whole TTL: a refresh that stalls
// lets the lease lapse with it, so that a stall shows as ErrLockLost, as
// in Familia, rather than as temp keys lost. A refresh that is slow but
// moving, over a family of many buckets, does not hold heartbeats back.
// Instead, each refresh gives the temp keys a TTL long enough to last
// until the next one has renewed them: TTL + TTL/3 + twice the time a
// refresh of that many keys took (measured, per key, by the last one),
// and at least 2×TTL. When that is more than before, the run logs it; a
// temp key that expires all the same is found lost, and fails the run
// with ErrTempKeyLost, saying how long refreshing took.
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
	leaseOwner // what it needs of its run: set once

	// temps is held by a refresh, from its snapshot of the temp keys to its
	// check of what it found, and by a catch-up's write, which may empty
	// temp keys: a refresh must not take a key emptied by a replayed change
	// for a lost one.
	temps sync.Mutex

	mu       sync.Mutex    // guards the fields below
	renewed  renewals      // when it last renewed: a resumed lease goes on from there
	inFlight beatsInFlight // the heartbeats on their way
	watchdog *time.Timer
	stopped  bool
	stop     chan struct{} // closed by end
}

// leaseOwner is what a lease needs of its run.
type leaseOwner struct {
	redis    *protocol.Redis
	locks    []*protocol.Lock
	ttl      time.Duration
	key      string // the builders' keys, for errors
	cancel   context.CancelCauseFunc
	log      *slog.Logger
	stall    *stallWatch // checked at every tick of the heartbeats
	fence    beatFence
	tempKeys tempRenewal
}

// beatFence is what a heartbeat fences the run with, besides its locks, and
// where what it reads goes.
type beatFence struct {
	acked   func() int64           // batches Redis acknowledged: the record must hold as many
	status  func() []string        // the run's status, for the record
	control func(protocol.Control) // an operator's requests, as the heartbeat read them
	seen    func() []int64         // the log counts seen (protocol.Logs.Seen)
}

// tempRenewal is what the refresh renews: the temp keys of targets.
type tempRenewal struct {
	targets *targets
	// secs is the temp keys' TTL, in seconds: 2×TTL, or longer when a
	// refresh takes long (see lease.tempTTL). The batches' EXPIRE NX
	// reads it too.
	secs *atomic.Int64
	// renew, if not nil, replaces the refresh of the temp keys: a run in
	// Generations mode has none.
	renew func(context.Context) error
}

// renewals are when a lease last renewed the run's locks and temp keys,
// and how long a refresh takes.
type renewals struct {
	lastBeat time.Time // when the last successful heartbeat was sent
	// refreshed is when the refresh last made progress: started, or
	// renewed a chunk.
	refreshed time.Time
	// perKey is the time the last complete refresh took per temp key.
	perKey time.Duration
}

// beatsInFlight are the heartbeats on their way. A heartbeat riding behind
// a round trip that takes longer than a heartbeat period (a large batch on
// a slow server) does not hold the next one back: that one goes alone, so
// that the lock is renewed whatever the batches' round trips take.
type beatsInFlight struct {
	lastSend time.Time // when a batch last went out
	riding   time.Time // when the heartbeat riding in a batch's round trip was claimed (zero: none)
	alone    bool      // whether one sent alone is in flight
}

// heartbeatEvery is how often the heartbeat renews a run of lease ttl.
func heartbeatEvery(ttl time.Duration) time.Duration { return min(time.Second, ttl/3) }

// newLease starts the lease of locks acquired at (or after) start: the
// temp keys, written since, live until start plus their TTL at least.
func newLease(x leaseOwner, start time.Time) *lease {
	l := &lease{leaseOwner: x, renewed: renewals{lastBeat: start, refreshed: start}, stop: make(chan struct{})}
	l.watchdog = time.AfterFunc(time.Until(start.Add(l.ttl)), l.lapse)
	return l
}

// resume returns a new lease of l's run, after l ended for a publish that
// did not happen: it goes on from l's last heartbeat and refresh.
func (l *lease) resume(x leaseOwner) *lease {
	l.mu.Lock()
	renewed := l.renewed
	l.mu.Unlock()
	n := newLease(x, renewed.lastBeat)
	n.renewed = renewed
	return n
}

// lapsed reports whether no heartbeat has reached Redis for a whole TTL by
// now: the locks have expired there, whether or not the watchdog has run
// yet (a loaded machine can run it late).
func (l *lease) lapsed(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return now.Sub(l.renewed.lastBeat) >= l.ttl
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
func (l *lease) claim(now time.Time, alone bool) (protocol.Heartbeat, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	every := heartbeatEvery(l.ttl)
	if !alone {
		l.inFlight.lastSend = now
	}
	f := &l.inFlight
	if l.stopped || f.alone || now.Sub(l.renewed.lastBeat) < every || now.Sub(l.renewed.refreshed) > l.ttl {
		return protocol.Heartbeat{}, false
	}
	stuck := !f.riding.IsZero() && now.Sub(f.riding) >= every
	switch {
	case !alone && f.riding.IsZero():
		f.riding = now
	case alone && (stuck || f.riding.IsZero() && now.Sub(f.lastSend) >= every/2):
		f.alone = true
	default:
		return protocol.Heartbeat{}, false
	}
	return protocol.Heartbeat{Locks: l.locks, Acked: l.fence.acked(), Status: l.fence.status(), Seen: l.fence.seen()}, true
}

// command returns h as a command for a batch's DoMulti.
func (l *lease) command(h protocol.Heartbeat) (rueidis.Completed, error) {
	return l.redis.Lease.BeatCommand(h)
}

// settle records the reply of heartbeat h, claimed and sent at sent. reply
// is the reply to command, or nil when h was sent alone.
func (l *lease) settle(ctx context.Context, sent time.Time, h protocol.Heartbeat, reply *rueidis.RedisResult) {
	var c protocol.Control
	var err error
	if reply != nil {
		c, err = l.redis.Lease.BeatReply(ctx, h, *reply)
	} else {
		c, err = l.redis.Lease.Beat(ctx, h)
	}
	l.mu.Lock()
	if reply != nil {
		l.inFlight.riding = time.Time{}
	} else {
		l.inFlight.alone = false
	}
	// Two heartbeats may be in flight (see riding): the later one sent
	// decides; an earlier one's reply, if it comes last, changes nothing.
	latest := err == nil && sent.After(l.renewed.lastBeat)
	if latest {
		l.renewed.lastBeat = sent
		if !l.stopped {
			l.watchdog.Reset(time.Until(sent.Add(l.ttl)))
		}
	}
	l.mu.Unlock()
	switch {
	case latest:
		l.fence.control(c)
	case err == nil:
		// An earlier heartbeat's reply after a later one's: stale.
	case errors.Is(err, ErrLockLost), errors.Is(err, ErrWritesLost):
		l.cancel(err)
	case protocol.Refused(err) != nil:
		// Rights do not come back by themselves: fail now, saying which,
		// rather than at the end of the lease as a stall.
		l.cancel(&Error{Op: "lease", Key: l.key, Err: protocol.Refused(err)})
	}
	// Other failures (a timeout, a dropped connection) are not fatal yet:
	// the next heartbeat may succeed, and if none does within TTL the
	// watchdog ends the run.
}

// refresh renews every temp key's TTL, in chunks, and checks what it finds.
func (l *lease) refresh(ctx context.Context) {
	if l.tempKeys.renew != nil {
		l.progressed(time.Now())
		if err := l.tempKeys.renew(ctx); err != nil {
			l.log.Debug("keyswap: could not renew the run's counters; the next refresh tries again", "key", l.key, "err", err)
		}
		return
	}
	l.temps.Lock()
	defer l.temps.Unlock()
	snap := protocol.Snap(l.tempKeys.targets.temps())
	ttl := l.tempTTL(len(snap.Temps))
	started := time.Now()
	l.progressed(started)
	states, err := l.redis.Lease.Refresh(ctx, l.locks[0], snap.Keys(), ttl, func() { l.progressed(time.Now()) })
	took := time.Since(started)
	switch {
	case errors.Is(err, ErrLockLost):
		l.cancel(err)
	case err != nil:
		// Not fatal yet: the next refresh may succeed; a heartbeat waits
		// for one that makes progress (see claim). A refresh the lease's
		// end stopped is over.
	default:
		if n := len(snap.Temps); n > 0 {
			l.mu.Lock()
			l.renewed.perKey = took / time.Duration(n)
			l.mu.Unlock()
		}
		if err := snap.Check(states, "during the run"); err != nil {
			l.cancel(&Error{Op: "lease", Key: l.key, Err: fmt.Errorf("%w (refreshing the run's %d temp keys took %v, with a TTL of %v, for a lease of %v: a longer Options.TTL gives them more)", err, len(snap.Temps), took.Round(time.Millisecond), ttl, l.ttl)})
		}
	}
}

// progressed records that the refresh made progress at t.
func (l *lease) progressed(t time.Time) {
	l.mu.Lock()
	l.renewed.refreshed = t
	l.mu.Unlock()
}

// tempTTL returns the TTL a refresh of n temp keys gives them: long enough
// that they outlive the next refresh, which starts TTL/3 after this one
// ends and takes as long, at the time per key the last refresh took. It
// only grows, and the batches' EXPIRE NX gives it to the keys they create.
func (l *lease) tempTTL(n int) time.Duration {
	l.mu.Lock()
	perKey := l.renewed.perKey
	l.mu.Unlock()
	need := l.ttl + l.ttl/3 + 2*perKey*time.Duration(n) + time.Second
	secs := int64((need + time.Second - 1) / time.Second)
	for {
		old := l.tempKeys.secs.Load()
		if secs <= old {
			return time.Duration(old) * time.Second
		}
		if l.tempKeys.secs.CompareAndSwap(old, secs) {
			l.log.Warn("keyswap: refreshing the temp keys takes long for the lease (Options.TTL); their TTL grows to cover it",
				"key", l.key, "temp_keys", n, "refresh", (perKey * time.Duration(n)).Round(time.Millisecond), "ttl", l.ttl, "temp_ttl", time.Duration(secs)*time.Second)
			return time.Duration(secs) * time.Second
		}
	}
}

// run sends the heartbeats no batch carried and watches the source for a
// stall, and refreshes the temp keys every TTL/3 in a goroutine of its
// own, until ctx is done or the lease is stopped. It returns once the
// refresh has stopped too.
func (l *lease) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	var refreshing sync.WaitGroup
	defer func() {
		// Cancel first: a refresh in progress stops at its next chunk,
		// rather than hold up the publish, which waits for the lease to
		// end, while the locks' TTL runs out.
		cancel()
		refreshing.Wait()
	}()
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
