package rebuild

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/keyswap/keyswap/guards"
	"github.com/keyswap/keyswap/internal/diff"
	"github.com/keyswap/keyswap/internal/protocol"
	"golang.org/x/sync/errgroup"
)

// ErrDiscarded reports that a held run was discarded (Held.Discard, or
// "keyswap discard" from an operator), not published: the live keys are
// untouched and the temp keys deleted.
var ErrDiscarded = errors.New("the held run was discarded")

// reviewer is the stage between the catch-up and the publish: it scans the
// families' live buckets while the source runs (newReviewer), then reviews
// what the run built next to what is live, runs the guards, and holds a
// held run until it is decided (decide). The publish deletes the live
// buckets the run did not rebuild (live), and drops the kept previous
// values the scans found (runState.stalePrevs).
type reviewer struct {
	x     *runState
	scans *errgroup.Group   // the family scans, concurrent with the source
	live  []map[string]bool // what they found: the families' live buckets
}

// newReviewer returns the reviewer of x, and starts a SCAN per family
// builder for its live keys, whose leftovers become orphans at publish,
// under ctx.
func newReviewer(ctx context.Context, x *runState) *reviewer {
	g, ctx := errgroup.WithContext(ctx)
	rv := &reviewer{x: x, scans: g}
	rv.live = rv.scanFamilies(ctx)
	return rv
}

// wait waits for the family scans.
func (rv *reviewer) wait() error { return rv.scans.Wait() }

// decide runs the guards, once the scans are done, and holds a held run
// until it is decided: it returns an error when the run must not be
// published.
func (rv *reviewer) decide(ctx context.Context) error {
	x := rv.x
	review, err := rv.review(ctx)
	if err != nil {
		return err
	}
	if err := rv.guard(review); err != nil {
		return err
	}
	if x.held == nil {
		return nil
	}
	x.setPhase(PhaseHeld)
	publish, err := x.held.hold(ctx, x, review, rv.live)
	switch {
	case err != nil:
		return protocol.Wrap("run", x.r.key, err)
	case !publish:
		return &Error{Op: "publish", Key: x.r.key, Err: ErrDiscarded}
	}
	return nil
}

// review returns what the run built next to what is live.
func (rv *reviewer) review(ctx context.Context) (guards.Review, error) {
	x, r, live := rv.x, rv.x.r, rv.live
	byBuilder := make([][]*target, len(r.owners))
	for _, t := range x.targets.all() {
		byBuilder[t.builder] = append(byBuilder[t.builder], t)
	}
	var out guards.Review
	for i, o := range r.owners {
		br := guards.BuilderReview{Key: o.key, Family: o.family}
		var temps, lives []string
		for _, t := range byBuilder[i] {
			temps = append(temps, t.Key)
		}
		if br.Family {
			// The buckets live when the run began, and those it writes:
			// a change applied during the run may have created one.
			all := maps.Clone(live[i])
			for _, t := range byBuilder[i] {
				all[t.Live] = true
			}
			lives = slices.Sorted(maps.Keys(all))
		} else {
			lives = []string{o.key}
		}
		for j, l := range lives {
			lives[j] = x.liveKey(l)
		}
		var err error
		if br.New, br.NewKeys, err = rv.total(ctx, temps); err != nil {
			return guards.Review{}, err
		}
		if br.Live, br.LiveKeys, err = rv.total(ctx, lives); err != nil {
			return guards.Review{}, err
		}
		out.Builders = append(out.Builders, br)
	}
	return out, nil
}

// total returns the entries of ks and how many of them exist.
func (rv *reviewer) total(ctx context.Context, ks []string) (entries int64, present int, err error) {
	r := rv.x.r
	types, sizes, err := diff.Sizes(ctx, r.redis.Client(), ks)
	if err != nil {
		return 0, 0, &Error{Op: "guard", Key: r.key, Err: err}
	}
	for i, s := range sizes {
		entries += s
		if types[i] != "none" {
			present++
		}
	}
	return entries, present, nil
}

// guard runs the guards on review.
func (rv *reviewer) guard(review guards.Review) error {
	r := rv.x.r
	for _, g := range r.opts.Guards {
		if err := g(review); err != nil {
			return &Error{Op: "guard", Key: r.key, Err: fmt.Errorf("%w: %w", guards.ErrRefused, err)}
		}
	}
	return nil
}
