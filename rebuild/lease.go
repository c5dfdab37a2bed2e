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

// lease keeps a run's locks and temp keys alive, and cancels the run when
// they are lost.
//
// A renewal is the touch of package run: one script that compare-and-extends
// every lock and then resets every temp key's TTL. Only renewals extend the
// locks, and they reset every temp key at the same instant, so a temp key's
// deadline is never earlier than its lock's; between renewals, a batch's
// EXPIRE NX only gives the temp keys it creates their first TTL, which ends
// after the lock's deadline.
//
// A renewal is due TTL/3 after the previous one. It rides in the DoMulti of
// the next batch sent, at no extra round trip. When no batch is sent but
// batches did complete since the last renewal (a slow source), a ticker
// renews on its own. When no batch completes for a whole TTL there is no
// renewal, the locks expire in Redis, and the watchdog cancels the run with
// ErrLockLost: a stalled process must not hold the lock forever.
type lease struct {
	redis   *run.Redis
	locks   []*run.Lock
	targets *targets
	ttl     time.Duration
	key     string // the builders' keys, for errors
	cancel  context.CancelCauseFunc
	done    func() int64 // batches completed so far

	mu        sync.Mutex
	last      time.Time // when the last successful renewal was sent
	lastDone  int64     // batches completed when it was claimed
	inFlight  bool
	watchdog  *time.Timer
	stopped   bool
	stopTimer chan struct{}
}

// newLease starts the lease of locks acquired at (or after) start.
func newLease(redis *run.Redis, locks []*run.Lock, ts *targets, ttl time.Duration, key string,
	cancel context.CancelCauseFunc, done func() int64, start time.Time) *lease {
	l := &lease{redis: redis, locks: locks, targets: ts, ttl: ttl, key: key, cancel: cancel, done: done,
		last: start, stopTimer: make(chan struct{})}
	l.watchdog = time.AfterFunc(time.Until(start.Add(ttl)), l.lapse)
	return l
}

// lapse cancels the run: no renewal reached Redis within TTL, so the locks
// have expired there, or are about to.
func (l *lease) lapse() {
	l.cancel(&Error{Op: "lease", Key: l.key, Err: fmt.Errorf("%w: no renewal for a whole TTL (%v): the run stalled", ErrLockLost, l.ttl)})
}

// claim reserves the next renewal if one is due and none is in flight, and
// returns a snapshot of the temp keys it must cover.
func (l *lease) claim(now time.Time, needProgress bool) (run.Snapshot, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped || l.inFlight || now.Sub(l.last) < l.ttl/3 {
		return run.Snapshot{}, false
	}
	done := l.done()
	if needProgress && done == l.lastDone {
		return run.Snapshot{}, false
	}
	l.inFlight = true
	l.lastDone = done
	return run.Snap(l.targets.temps()), true
}

// command returns the renewal of rn as a command for a batch's DoMulti.
func (l *lease) command(rn run.Snapshot) (rueidis.Completed, error) {
	return l.redis.TouchCommand(l.locks, rn.Keys())
}

// settle records the reply of a renewal claimed and sent at sent. reply is
// the reply to command, or nil when the renewal was sent alone.
func (l *lease) settle(ctx context.Context, sent time.Time, rn run.Snapshot, reply *rueidis.RedisResult) {
	var states []run.TempState
	var err error
	if reply != nil {
		states, err = l.redis.TouchReply(ctx, *reply, l.locks, rn.Keys())
	} else {
		states, err = l.redis.Touch(ctx, "touch", l.locks, rn.Keys())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight = false
	if err != nil {
		if errors.Is(err, ErrLockLost) {
			l.cancel(err)
		}
		// Other failures (a timeout, a dropped connection) are not fatal
		// yet: the next renewal may succeed, and if none does within TTL
		// the watchdog ends the run.
		return
	}
	l.last = sent
	if !l.stopped {
		l.watchdog.Reset(time.Until(sent.Add(l.ttl)))
	}
	if err := rn.Check(states, "during the run"); err != nil {
		l.cancel(&Error{Op: "lease", Key: l.key, Err: err})
	}
}

// run renews, every TTL/6, whenever a renewal is due that no batch carried,
// as long as batches completed since the last one. It returns when ctx is
// done or the lease is stopped.
func (l *lease) run(ctx context.Context) {
	tick := time.NewTicker(max(l.ttl/6, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.stopTimer:
			return
		case now := <-tick.C:
			if rn, ok := l.claim(now, true); ok {
				l.settle(ctx, now, rn, nil)
			}
		}
	}
}

// stop ends renewals and the watchdog, before the final touch and publish.
func (l *lease) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stopped {
		l.stopped = true
		l.watchdog.Stop()
		close(l.stopTimer)
	}
}
