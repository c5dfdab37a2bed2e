package rebuild_test

import (
	"errors"
	"testing"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
)

// C102: a run without a group loses its lock while its source
// stalls; a sweep removes its abandoned generation 1 (the registry without
// a group keeps only next); a run in group a claims the index and
// publishes the group's generation 1, whose data keys are the same names;
// then the stalled run fails, and its RemoveOwn (absent field: "the keys
// are still the caller's") deletes the group's current generation.
func TestGroupClaimStaleRunBeforeClaim(t *testing.T) {
	for _, failAfter := range []bool{false, true} {
		t.Run(map[bool]string{false: "writes", true: "source-fails"}[failAfter], func(t *testing.T) { staleBeforeClaim(t, failAfter) })
	}
}

func staleBeforeClaim(t *testing.T, failAfter bool) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ga, _, prefix := fenceNames(d)
		stalled, resume := make(chan struct{}), make(chan struct{})
		u := genRebuilder(t, d, prefix, rebuild.Options{})
		done := make(chan error, 1)
		go func() {
			_, err := u.Run(ctx, genSource(genUsers(50, 5), 10, func() error {
				close(stalled)
				<-resume
				if failAfter {
					return errGenSource
				}
				return nil
			}))
			done <- err
		}()
		<-stalled
		// The lock is lost (it expired while the process or network stalled).
		if err := d.Other.Do(ctx, d.Other.B().Del().Key(keys.LockKey(prefix, d.Cluster)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		res, err := gens.Sweep(ctx, d.Other, gens.Index{Live: prefix, Family: true}, gens.Options{Grace: 1})
		t.Logf("ungrouped sweep: %+v %v", res, err)
		us := genUsers(30, 3)
		st, err := genRebuilder(t, d, prefix, rebuild.Options{Group: ga}).Run(ctx, genSource(us, -1, nil))
		if err != nil {
			t.Fatalf("Run in group a: %v", err)
		}
		g := st.Generations[prefix]
		t.Logf("group a's generation: %d", g)
		wantBuckets(t, d, prefix, g, us)
		close(resume)
		err = <-done
		t.Logf("stalled run: %v", err)
		if !errors.Is(err, rebuild.ErrLockLost) {
			t.Logf("(not ErrLockLost)")
		}
		got := redistest.Keys(t, d.Other, keys.GenPrefix(prefix, g))
		t.Logf("group a's current generation keys after the stalled run failed: %v", got)
		wantBuckets(t, d, prefix, g, us)
	})
}
