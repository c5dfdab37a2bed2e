package rebuild

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/keyswap/keyswap/guards"
	"github.com/keyswap/keyswap/internal/diff"
	"github.com/keyswap/keyswap/sources"
)

// Held is a run that built everything and stopped short of its publish
// (see [Rebuilder.Build]). It keeps its lease meanwhile: its locks, temp
// keys and log of changes stay alive, and other runs of its keys fail with
// ErrInProgress. Inspect it with Review and Diff, then end it with Publish
// or Discard, or let an operator decide with Await ("keyswap publish" or
// "keyswap discard"). Cancelling the context given to Build discards it.
//
// Its methods are safe for concurrent use. Publish, Discard and Await may
// be called more than once, and from several goroutines: the first
// decision wins, and every call returns the run's outcome.
type Held[T any] struct {
	*held
}

// held is the state of a Held run, which its run's later stages share: it
// does not depend on the items' type.
type held struct {
	x      *runState
	review guards.Review
	live   []map[string]bool // the families' live buckets

	ready  chan struct{} // closed when the run is held
	decide chan bool     // true: publish; false: discard
	done   chan struct{} // closed when the run has ended
	stats  Stats         // the run's stats, once done
	err    error         // the run's error, once done
	panic  *panicked     // a panic in the run's goroutine, to re-panic
}

// panicked carries a panic out of the run's goroutine.
type panicked struct{ value any }

// Build runs src through the builders as [Rebuilder.Run] does, and catches
// up with the changes applied meanwhile, but stops short of the publish:
// it returns a [Held] run once everything is built and the guards passed,
// or the run's error if it failed before (Stats and error as Run's).
//
// The run goes on in a goroutine of its own: src is read there, and a
// panic in src or a builder reaches the caller of Build (or of the Held
// method waiting then), after the cleanup, as with Run. ctx bounds the
// whole run, held time included: cancelling it discards a held run.
func (r *Rebuilder[T]) Build(ctx context.Context, src sources.Source[T]) (*Held[T], Stats, error) {
	h := &Held[T]{&held{ready: make(chan struct{}), decide: make(chan bool, 1), done: make(chan struct{})}}
	go h.run(ctx, r, src)
	select {
	case <-h.ready:
		return h, Stats{}, nil
	case <-h.done:
		h.repanic()
		return nil, h.stats, h.err
	}
}

// run runs the execution, and records how it ended.
func (h *Held[T]) run(ctx context.Context, r *Rebuilder[T], src sources.Source[T]) {
	ended := false
	defer func() {
		if v := recover(); v != nil {
			h.panic = &panicked{v}
		} else if !ended {
			h.err = &Error{Op: "run", Key: r.key, Err: errGoexit} // a Goexit in src
		}
		close(h.done)
	}()
	h.stats, h.err = r.run(ctx, src, h)
	ended = true
}

// repanic re-panics a panic of the run's goroutine.
func (h *held) repanic() {
	if h.panic != nil {
		panic(h.panic.value)
	}
}

// hold is called by the run once built: it publishes the review, and
// waits for a decision, or for the run to end another way, for at most
// Options.MaxHold.
func (h *held) hold(ctx context.Context, x *runState, review guards.Review, live []map[string]bool) (publish bool, err error) {
	h.x, h.review, h.live = x, review, live
	close(h.ready)
	maxHold := time.NewTimer(x.r.opts.MaxHold)
	defer maxHold.Stop()
	select {
	case publish := <-h.decide:
		return publish, nil
	case <-ctx.Done():
		return false, context.Cause(ctx)
	case <-maxHold.C:
		return false, &Error{Op: "publish", Key: x.r.key, Err: fmt.Errorf("%w: held for %v (Options.MaxHold) without a decision: discarded, so that a forgotten held run does not keep its locks", ErrDiscarded, x.r.opts.MaxHold)}
	}
}

// decideBy records an operator's decision, read by a heartbeat: the first
// decision wins.
func (h *held) decideBy(publish bool) {
	select {
	case h.decide <- publish:
	default:
	}
}

// Review returns what the run built next to what is live, as the guards
// saw it.
func (h *Held[T]) Review() guards.Review { return h.review }

// Publish publishes the held run, after catching up with the changes
// applied while it was held, and returns the run's Stats and error, as Run
// would. ctx bounds the wait only: the publish goes on if ctx ends first.
func (h *Held[T]) Publish(ctx context.Context) (Stats, error) {
	h.decideBy(true)
	return h.wait(ctx)
}

// Discard discards the held run: its temp keys are deleted and its locks
// released, and the live keys are left as they are. It returns nil once
// discarded, or the error the run ended with if it ended otherwise first
// (a lost lease, or an operator's publish).
func (h *Held[T]) Discard(ctx context.Context) error {
	h.decideBy(false)
	_, err := h.wait(ctx)
	if errors.Is(err, ErrDiscarded) {
		return nil
	}
	if err == nil {
		return &Error{Op: "publish", Key: h.x.r.key, Err: errors.New("the held run was published (by an operator?) before it could be discarded")}
	}
	return err
}

// Await waits for an operator's decision ("keyswap publish <key>" or
// "keyswap discard <key>"), which a heartbeat reads within a second, and
// returns the run's outcome: its Stats once published, or an error
// matching ErrDiscarded. A decision made through Publish or Discard ends
// it too. ctx bounds the wait only.
func (h *Held[T]) Await(ctx context.Context) (Stats, error) { return h.wait(ctx) }

// wait waits for the run to end.
func (h *held) wait(ctx context.Context) (Stats, error) {
	select {
	case <-h.done:
		h.repanic()
		return h.stats, h.err
	case <-ctx.Done():
		return Stats{}, context.Cause(ctx)
	}
}

// Diff compares the held run's keys with the live keys, without blocking
// Redis: each comparison reads at most guards.DiffOptions.Limit entries of each
// key with SCAN cursors and batched lookups, exact when one of the two keys
// is within the limit, and estimates from random samples when both are past
// it ('keyswap diff' shows the estimates' 95% confidence intervals). Once
// the run has ended (published, discarded, or failed), its temp keys are
// gone: Diff returns an error saying so, also when the run ends while Diff
// reads.
func (h *Held[T]) Diff(ctx context.Context, o guards.DiffOptions) (guards.Diff, error) {
	if err := h.ended(); err != nil {
		return guards.Diff{}, err
	}
	d, err := h.diff(ctx, o)
	if eerr := h.ended(); eerr != nil {
		return guards.Diff{}, eerr
	}
	return d, err
}

// ended returns an error if the held run has ended, saying how.
func (h *held) ended() error {
	select {
	case <-h.done:
	default:
		return nil
	}
	how := "it was published"
	if h.err != nil {
		how = "it ended with: " + h.err.Error()
	}
	return &Error{Op: "diff", Key: h.x.r.key, Err: fmt.Errorf("the held run has ended, and its temp keys with it: nothing to compare (%s)", how)}
}

// diff is Diff, while the run is held.
func (h *held) diff(ctx context.Context, o guards.DiffOptions) (guards.Diff, error) {
	x := h.x
	r := x.r
	opts := diff.Options{Limit: o.Limit, Samples: o.Samples}
	maxKeys := o.MaxKeys
	if maxKeys <= 0 {
		maxKeys = 100
	}
	temps := make([]map[string]string, len(r.owners)) // live -> temp, per builder
	for i := range temps {
		temps[i] = map[string]string{}
	}
	for _, t := range x.targets.all() {
		temps[t.builder][t.Live] = t.Key
	}
	var out guards.Diff
	for i, o := range r.owners {
		bd := guards.BuilderDiff{Key: o.key, Family: o.family, Exact: true}
		lives := []string{o.key}
		if bd.Family {
			lives = h.buckets(&bd, h.live[i], temps[i], maxKeys)
		}
		for _, l := range lives {
			temp := temps[i][l]
			if temp == "" {
				temp = x.targets.newTemp(l) // never written: compares as empty
			}
			k, err := diff.Compare(ctx, r.redis.Client(), x.liveKey(l), temp, opts)
			if err != nil {
				return guards.Diff{}, &Error{Op: "diff", Key: l, Err: fmt.Errorf("comparing with %s: %w", temp, err)}
			}
			kd := guards.KeyDiff{Live: k.Live, Temp: k.Temp, Type: k.Type, LiveType: k.LiveType, NewSize: k.NewSize, LiveSize: k.LiveSize,
				Added: k.Added, Removed: k.Removed, Changed: k.Changed, Exact: k.Exact}
			for _, s := range k.Samples {
				kd.Samples = append(kd.Samples, guards.DiffEntry(s))
			}
			bd.Added, bd.Removed, bd.Changed = bd.Added+k.Added, bd.Removed+k.Removed, bd.Changed+k.Changed
			bd.Exact = bd.Exact && k.Exact
			bd.Keys = append(bd.Keys, kd)
		}
		out.Builders = append(out.Builders, bd)
	}
	return out, nil
}

// buckets returns the buckets of a family to compare, at most maxKeys of
// those live (live) or rebuilt (temps, live -> temp), and counts them in bd.
func (h *held) buckets(bd *guards.BuilderDiff, live map[string]bool, temps map[string]string, maxKeys int) []string {
	all := maps.Clone(live)
	for l := range temps {
		if !all[l] {
			bd.BucketsAdded++
		}
		all[l] = true
	}
	for l := range live {
		if _, ok := temps[l]; !ok {
			bd.BucketsRemoved++
		}
	}
	lives := slices.Sorted(maps.Keys(all))
	bd.Buckets = len(lives)
	if len(lives) > maxKeys {
		lives, bd.Exact = lives[:maxKeys], false
	}
	bd.Compared = len(lives)
	return lives
}
