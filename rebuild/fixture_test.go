package rebuild_test

import (
	"maps"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

// deployment is one Redis deployment a test runs against.
type deployment = redistest.Deployment

// forEachDeployment runs f as a parallel subtest per deployment.
func forEachDeployment(t *testing.T, f func(t *testing.T, d deployment)) {
	t.Helper()
	env.ForEachDeployment(t, f)
}

// user is the item type of most tests.
type user = redistest.User

// flight counts the calls in flight and the most at once.
type flight struct{ now, most atomic.Int64 }

// enter counts a call as started; call the returned func when it returns.
func (f *flight) enter() (exit func()) {
	n := f.now.Add(1)
	for m := f.most.Load(); n > m && !f.most.CompareAndSwap(m, n); m = f.most.Load() {
	}
	return func() { f.now.Add(-1) }
}

// users returns n users (redistest.Users).
func users(n int) []user { return redistest.Users(n) }

// sortedSets returns the members of each set of sets, sorted, as
// redistest.SMembers returns them.
func sortedSets(sets map[string]map[string]bool) map[string][]string {
	out := make(map[string][]string, len(sets))
	for k, set := range sets {
		out[k] = slices.Sorted(maps.Keys(set))
	}
	return out
}
