// Package guards decides whether a run's result may replace the live keys.
// Before a Rebuilder publishes, each [Guard] of its Options.Guards sees a
// [Review]: the size of what the run built next to the live keys'. A guard
// that returns an error refuses the publish: the run fails with
// [ErrRefused], and the live keys stay as they are. [RefuseEmpty] and
// [RefuseShrink] refuse the results a broken source produces.
//
// A run that a Rebuilder's Build holds before its publish shows its Review,
// and its [Diff] with the live keys entry by entry, to whoever decides.
package guards

import (
	"errors"
	"fmt"
)

// ErrRefused reports that a guard (a Rebuilder's Options.Guards) refused
// the publish. Nothing was published: the live keys are untouched, and the run's temp
// keys were deleted, as a failed run's are. It does not match
// ErrInProgress.
var ErrRefused = errors.New("a guard refused the publish")

// Review is what a run built, next to what is live, once the source is
// drained and the changes applied meanwhile are caught up: what a [Guard]
// decides on, and what a held run's Review method (rebuild.Held) shows.
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
