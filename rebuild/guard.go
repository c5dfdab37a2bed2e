package rebuild

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/keyswap/keyswap/internal/diff"
)

// ErrRefused reports that a guard (Options.Guards) refused the publish.
// Nothing was published: the live keys are untouched, and the run's temp
// keys were deleted, as a failed run's are. It does not match
// ErrInProgress.
var ErrRefused = errors.New("a guard refused the publish")

// ErrDiscarded reports that a held run was discarded (Held.Discard, or
// "keyswap discard" from an operator), not published: the live keys are
// untouched and the temp keys deleted.
var ErrDiscarded = errors.New("the held run was discarded")

// Review is what a run built, next to what is live, once the source is
// drained and the changes applied meanwhile are caught up: what a [Guard]
// decides on, and what [Held.Review] shows.
type Review struct {
	// Builders has one entry per builder, in the Rebuilder's order.
	Builders []BuilderReview
}

// BuilderReview is one builder's part of a [Review].
type BuilderReview struct {
	// Key is the builder's key: its live key, or a family's prefix.
	Key string
	// Family reports a family builder: its figures sum its buckets.
	Family bool
	// New and Live are the entries (fields, members, elements; 1 for a key
	// of another type) of the new keys and of the live ones: HLEN, ZCARD,
	// SCARD and the like, summed over a family's buckets.
	New, Live int64
	// NewKeys and LiveKeys are the keys: 0 or 1 for a plain builder, the
	// buckets of a family.
	NewKeys, LiveKeys int
}

// A Guard decides, before the publish, whether a run's result may replace
// the live keys: it returns an error to refuse it, and the run fails with
// an error matching [ErrRefused] that wraps the guard's. Guards run in the
// run's goroutine, once, after the last write and before the publish (and
// before a held run is held).
type Guard func(Review) error

// RefuseEmpty returns a Guard that refuses to replace a non-empty live key
// (or family) with an empty one: a source that returned nothing by mistake
// would otherwise delete the index.
func RefuseEmpty() Guard {
	return func(r Review) error {
		for _, b := range r.Builders {
			if b.New == 0 && b.Live > 0 {
				return fmt.Errorf("%s would go from %d entries to none (RefuseEmpty)", b.Key, b.Live)
			}
		}
		return nil
	}
}

// RefuseShrink returns a Guard that refuses a result smaller than ratio
// times the live one, for every builder: RefuseShrink(0.9) refuses to lose
// more than a tenth of an index. ratio must be in (0, 1].
func RefuseShrink(ratio float64) Guard {
	return func(r Review) error {
		if !(ratio > 0 && ratio <= 1) {
			return fmt.Errorf("RefuseShrink(%v): the ratio must be in (0, 1]", ratio)
		}
		for _, b := range r.Builders {
			if float64(b.New) < ratio*float64(b.Live) {
				return fmt.Errorf("%s would shrink from %d entries to %d, below %.0f%% of its live size (RefuseShrink(%v))", b.Key, b.Live, b.New, 100*ratio, ratio)
			}
		}
		return nil
	}
}

// review returns what the run built next to what is live; live are the
// families' live buckets.
func (x *execution[T]) review(ctx context.Context, live []map[string]bool) (Review, error) {
	r := x.r
	byBuilder := make([][]*target, len(r.builders))
	for _, t := range x.targets.all() {
		byBuilder[t.builder] = append(byBuilder[t.builder], t)
	}
	var out Review
	for i, b := range r.builders {
		br := BuilderReview{Key: b.Key(), Family: r.owners[i].family}
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
			lives = []string{b.Key()}
		}
		var err error
		if br.New, br.NewKeys, err = total(ctx, x, temps); err != nil {
			return Review{}, err
		}
		if br.Live, br.LiveKeys, err = total(ctx, x, lives); err != nil {
			return Review{}, err
		}
		out.Builders = append(out.Builders, br)
	}
	return out, nil
}

// total returns the entries of ks and how many of them exist.
func total[T any](ctx context.Context, x *execution[T], ks []string) (entries int64, present int, err error) {
	types, sizes, err := diff.Sizes(ctx, x.r.redis.Client(), ks)
	if err != nil {
		return 0, 0, &Error{Op: "guard", Key: x.r.key, Err: err}
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
func (x *execution[T]) guard(review Review) error {
	for _, g := range x.r.opts.Guards {
		if err := g(review); err != nil {
			return &Error{Op: "guard", Key: x.r.key, Err: fmt.Errorf("%w: %w", ErrRefused, err)}
		}
	}
	return nil
}
