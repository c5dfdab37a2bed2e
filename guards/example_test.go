package guards_test

import (
	"errors"
	"fmt"

	"github.com/keyswap/keyswap/guards"
)

// A Rebuilder runs its Options.Guards on the Review of each run before the
// publish; here RefuseShrink sees one directly. An index that would lose
// half its entries is refused; one that grows passes.
func ExampleRefuseShrink() {
	guard := guards.RefuseShrink(0.9)
	half := guards.Review{Builders: []guards.BuilderReview{{Key: "users:by-email", New: 500, Live: 1000, NewKeys: 1, LiveKeys: 1}}}
	grown := guards.Review{Builders: []guards.BuilderReview{{Key: "users:by-email", New: 1200, Live: 1000, NewKeys: 1, LiveKeys: 1}}}
	fmt.Println(guard(half))
	fmt.Println(guard(grown))
	// Output:
	// users:by-email would shrink from 1000 entries to 500, below 90% of its live size (RefuseShrink(0.9))
	// <nil>
}

// A Guard is a function of a Review: this one refuses to publish a family
// that would lose more than 10 of its buckets, whatever its entries.
func ExampleGuard() {
	keepBuckets := guards.Guard(func(r guards.Review) error {
		for _, b := range r.Builders {
			if b.Family && b.LiveKeys-b.NewKeys > 10 {
				return fmt.Errorf("%s would lose %d buckets", b.Key, b.LiveKeys-b.NewKeys)
			}
		}
		return nil
	})
	review := guards.Review{Builders: []guards.BuilderReview{{Key: "users:by-country", Family: true, New: 900, Live: 1000, NewKeys: 180, LiveKeys: 200}}}
	err := keepBuckets(review)
	fmt.Println(err)
	// A Rebuilder fails the run with an error matching ErrRefused that
	// wraps the guard's: this is how it reads.
	err = fmt.Errorf("%w: %w", guards.ErrRefused, err)
	fmt.Println(errors.Is(err, guards.ErrRefused))
	// Output:
	// users:by-country would lose 20 buckets
	// true
}
