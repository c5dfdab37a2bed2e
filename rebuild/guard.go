package rebuild

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/keyswap/keyswap/guards"
	"github.com/keyswap/keyswap/internal/diff"
)

// ErrDiscarded reports that a held run was discarded (Held.Discard, or
// "keyswap discard" from an operator), not published: the live keys are
// untouched and the temp keys deleted.
var ErrDiscarded = errors.New("the held run was discarded")

// review returns what the run built next to what is live; live are the
// families' live buckets.
func (x *runState) review(ctx context.Context, live []map[string]bool) (guards.Review, error) {
	r := x.r
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
		if br.New, br.NewKeys, err = total(ctx, x, temps); err != nil {
			return guards.Review{}, err
		}
		if br.Live, br.LiveKeys, err = total(ctx, x, lives); err != nil {
			return guards.Review{}, err
		}
		out.Builders = append(out.Builders, br)
	}
	return out, nil
}

// total returns the entries of ks and how many of them exist.
func total(ctx context.Context, x *runState, ks []string) (entries int64, present int, err error) {
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
func (x *runState) guard(review guards.Review) error {
	for _, g := range x.r.opts.Guards {
		if err := g(review); err != nil {
			return &Error{Op: "guard", Key: x.r.key, Err: fmt.Errorf("%w: %w", guards.ErrRefused, err)}
		}
	}
	return nil
}
