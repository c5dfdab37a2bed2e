// Package track keeps a relay's status and metrics, and applies its
// changes through Rebuilder.Apply, retrying what may succeed later.
package track

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/keyswap/keyswap/capture"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// scope is the instrumentation scope of the relays' meter.
const scope = "github.com/keyswap/keyswap/capture"

// lagBuckets are the lag histogram's bucket boundaries, in seconds: from a
// millisecond (a relay keeping up) to an hour (one that was stopped).
var lagBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

// Tracker is a relay's status and metrics. Its methods are safe for
// concurrent use.
type Tracker struct {
	attrs       metric.MeasurementOption
	backlogUnit string

	changes, dropped, retries, reconnects metric.Int64Counter
	lag                                   metric.Float64Histogram
	meter                                 metric.Meter
	gauges                                []metric.Int64ObservableGauge // pending, backlog, falling behind; nil when they could not be created

	mu      sync.Mutex
	st      capture.Status
	pending []unit // read and not yet applied, oldest first
	now     func() time.Time
}

// unit is a group of changes read together.
type unit struct {
	n      int
	commit time.Time
}

// New returns the Tracker of a relay of kind ("postgres", "outbox") reading
// source, recording with mp (the global MeterProvider when nil), whose
// backlog is counted in backlogUnit ("By", "{row}"). An instrument that
// cannot be created goes to otel.Handle and records nothing.
func New(kind, source, backlogUnit string, mp metric.MeterProvider) *Tracker {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(scope)
	t := &Tracker{
		attrs:       metric.WithAttributeSet(attribute.NewSet(attribute.String("keyswap.relay", kind), attribute.String("keyswap.source", source))),
		backlogUnit: backlogUnit,
		now:         time.Now,
	}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		if err != nil || c == nil {
			errs = append(errs, err)
			return noop.Int64Counter{}
		}
		return c
	}
	t.changes = counter("keyswap.relay.changes", "{change}", "Changes a relay applied to the index.")
	t.dropped = counter("keyswap.relay.dropped", "{change}", "Changes a relay dropped as stale: outbox rows whose version was not above the one applied for their item.")
	t.retries = counter("keyswap.relay.retries", "{call}", "Apply calls a relay tried again, by error.type.")
	t.reconnects = counter("keyswap.relay.reconnects", "{connection}", "Times a relay lost its source and connected again, by error.type.")
	lag, err := m.Float64Histogram("keyswap.relay.lag", metric.WithUnit("s"),
		metric.WithDescription("Time from a change's commit to the return of the Apply that made it visible in Redis."),
		metric.WithExplicitBucketBoundaries(lagBuckets...))
	if err != nil || lag == nil {
		errs = append(errs, err)
		lag = noop.Float64Histogram{}
	}
	t.lag = lag
	pending, err1 := m.Int64ObservableGauge("keyswap.relay.pending", metric.WithUnit("{change}"), metric.WithDescription("Changes a relay read and has not applied yet."))
	backlog, err2 := m.Int64ObservableGauge("keyswap.relay.backlog", metric.WithUnit(backlogUnit), metric.WithDescription("What the source holds for a relay: WAL bytes behind a slot (By), or rows in an outbox ({row})."))
	behind, err3 := m.Int64ObservableGauge("keyswap.relay.falling_behind", metric.WithUnit("{relay}"), metric.WithDescription("1 while a relay's backlog is past its threshold."))
	if err := errors.Join(err1, err2, err3); err != nil {
		errs = append(errs, err)
	} else if pending != nil && backlog != nil && behind != nil {
		t.meter, t.gauges = m, []metric.Int64ObservableGauge{pending, backlog, behind}
	}
	if err := errors.Join(errs...); err != nil {
		otel.Handle(err)
	}
	return t
}

// Observe starts reporting the gauges (pending, backlog, falling behind),
// and returns the function that stops it. A relay observes them while its
// Run runs, so that a relay done with leaves nothing registered with the
// MeterProvider, which would keep it, and report its last values, for
// good.
func (t *Tracker) Observe() (stop func()) {
	if t.meter == nil {
		return func() {}
	}
	pending, backlog, behind := t.gauges[0], t.gauges[1], t.gauges[2]
	reg, err := t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := t.Status()
		var fb int64
		if st.FallingBehind {
			fb = 1
		}
		o.ObserveInt64(pending, st.Pending, t.attrs)
		o.ObserveInt64(backlog, st.Backlog, t.attrs)
		o.ObserveInt64(behind, fb, t.attrs)
		return nil
	}, pending, backlog, behind)
	if err != nil {
		otel.Handle(err)
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}

// Status returns a copy of the status.
func (t *Tracker) Status() capture.Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.st
	if len(t.pending) > 0 {
		st.Oldest = t.pending[0].commit
	}
	return st
}

// Connected records whether the relay reads its source.
func (t *Tracker) Connected(ok bool) {
	t.mu.Lock()
	t.st.Connected = ok
	t.mu.Unlock()
}

// Position records the position up to which every change is applied.
func (t *Tracker) Position(p string) {
	t.mu.Lock()
	t.st.Position = p
	t.mu.Unlock()
}

// Read records n changes read, the oldest committed at commit.
func (t *Tracker) Read(n int, commit time.Time) {
	if n == 0 {
		return
	}
	t.mu.Lock()
	t.pending = append(t.pending, unit{n, commit})
	t.st.Pending += int64(n)
	t.mu.Unlock()
}

// Drop forgets every change read and not applied: the relay lost its
// source and will read them again.
func (t *Tracker) Drop() {
	t.mu.Lock()
	t.pending = nil
	t.st.Pending = 0
	t.mu.Unlock()
}

// Applied records the oldest n changes read as applied, with the commit
// times of what they carried (one per transaction, or per row), and clears
// the last error.
func (t *Tracker) Applied(ctx context.Context, n int, commits []time.Time) {
	now := t.now()
	t.mu.Lock()
	t.donePendingLocked(n)
	t.st.Applied += int64(n)
	t.st.LastApplied = now
	if len(commits) > 0 {
		t.st.Lag = now.Sub(commits[len(commits)-1])
	}
	t.st.Err, t.st.ErrAt = nil, time.Time{}
	t.mu.Unlock()
	if n > 0 {
		t.changes.Add(ctx, int64(n), t.attrs)
	}
	for _, c := range commits {
		t.lag.Record(ctx, max(0, now.Sub(c).Seconds()), t.attrs)
	}
}

// Dropped records the oldest n changes read as dropped: stale, never
// applied.
func (t *Tracker) Dropped(ctx context.Context, n int) {
	if n == 0 {
		return
	}
	t.mu.Lock()
	t.donePendingLocked(n)
	t.st.Dropped += int64(n)
	t.mu.Unlock()
	t.dropped.Add(ctx, int64(n), t.attrs)
}

// donePendingLocked removes the oldest n changes from those pending. t.mu
// is held.
func (t *Tracker) donePendingLocked(n int) {
	for left := n; left > 0 && len(t.pending) > 0; {
		if t.pending[0].n <= left {
			left -= t.pending[0].n
			t.pending = t.pending[1:]
		} else {
			t.pending[0].n -= left
			left = 0
		}
	}
	t.st.Pending = max(0, t.st.Pending-int64(n))
}

// Backlog records the source's backlog and whether it is past the
// threshold.
func (t *Tracker) Backlog(n int64, falling bool) {
	t.mu.Lock()
	t.st.Backlog, t.st.FallingBehind = n, falling
	t.mu.Unlock()
}

// Failed records err as the last error.
func (t *Tracker) Failed(err error) {
	t.mu.Lock()
	t.st.Err, t.st.ErrAt = err, t.now()
	t.mu.Unlock()
}

// Reconnect records err, which lost the relay its source.
func (t *Tracker) Reconnect(ctx context.Context, err error) {
	t.mu.Lock()
	t.st.Reconnects++
	t.st.Connected = false
	t.st.Err, t.st.ErrAt = err, t.now()
	t.mu.Unlock()
	t.reconnects.Add(ctx, 1, t.attrs, metric.WithAttributes(attribute.String("error.type", ErrorType(err))))
}

// retried records err, after which an Apply is tried again.
func (t *Tracker) retried(ctx context.Context, err error) {
	t.mu.Lock()
	t.st.Retries++
	t.st.Err, t.st.ErrAt = err, t.now()
	t.mu.Unlock()
	t.retries.Add(ctx, 1, t.attrs, metric.WithAttributes(attribute.String("error.type", ErrorType(err))))
}

// Backoff is how long to wait before the attempt-th retry (from 0):
// doubling from 10 ms to 2 s.
func Backoff(attempt int) time.Duration {
	d := 10 * time.Millisecond
	for range min(attempt, 8) {
		d *= 2
	}
	return min(d, 2*time.Second)
}

// Sleep waits d, or until ctx ends; it returns ctx's cause then.
func Sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timer.C:
		return nil
	}
}

// Apply applies changes through r, in one call, and tries again, after a
// backoff, as long as the error is one that may go away (see Retryable).
// Before each call it calls check, when not nil, and returns its error
// without applying: check proves that the relay may still apply (it holds
// its lock). It returns nil once applied, check's error, the first error
// of Apply that will not go away, or ctx's cause.
func Apply[T any](ctx context.Context, t *Tracker, r *rebuild.Rebuilder[T], changes []index.Change[T], check func(context.Context) error) error {
	for attempt := 0; ; attempt++ {
		if check != nil {
			if err := check(ctx); err != nil {
				return err
			}
		}
		err := r.Apply(ctx, changes...)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if !Retryable(err) {
			return err
		}
		t.retried(ctx, err)
		if err := Sleep(ctx, Backoff(attempt)); err != nil {
			return err
		}
	}
}

// Retryable reports whether an error of Apply may go away by itself, so
// that applying the same changes again later may succeed: a lost reply
// (ErrOutcomeUnknown), a change refused while a rebuild that does not log
// changes holds a lock (ErrInProgress), and Redis busy, loading, out of
// memory, failing over or read-only. Any other error (a builder's Diff
// error, a key of another type, a missing right) would come back.
func Retryable(err error) bool {
	if errors.Is(err, rebuild.ErrOutcomeUnknown) || errors.Is(err, rebuild.ErrInProgress) {
		return true
	}
	var rerr *rueidis.RedisError
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		for _, p := range []string{"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "OOM"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
	}
	return false
}

// ErrorType returns a stable, low-cardinality name of err's kind for the
// error.type attribute.
func ErrorType(err error) string {
	var rerr *rueidis.RedisError
	switch {
	case errors.Is(err, rebuild.ErrOutcomeUnknown):
		return "outcome_unknown"
	case errors.Is(err, rebuild.ErrInProgress):
		return "in_progress"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.As(err, &rerr):
		word, _, _ := strings.Cut(rerr.Error(), " ")
		return "redis_" + strings.ToLower(word)
	}
	return "other"
}
