package rebuild_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
)

// TestGroupClaimStaleRunBeforeClaim (C102): a run without a group
// allocates generation 1 and stalls in its source; its lock is lost; a
// sweep removes its abandoned generation 1 (the registry without a group
// keeps only next); a run in group a claims the index and publishes. The
// group's generation starts above that next (the claim's floor), so when
// the stalled run goes on (its writes, then its failure at publish, or its
// source failing and its RemoveOwn) the group's current generation keeps
// exactly its data.
func TestGroupClaimStaleRunBeforeClaim(t *testing.T) {
	for _, tc := range []struct {
		name      string
		failAfter bool
		want      error
	}{
		{"writes", false, rebuild.ErrLockLost},
		{"source-fails", true, errGenSource},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachDeployment(t, func(t *testing.T, d deployment) {
				staleBeforeClaim(t, d, tc.failAfter, tc.want)
			})
		})
	}
}

func staleBeforeClaim(t *testing.T, d deployment, failAfter bool, want error) {
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
	// The lock is lost: it expired while the process or the network stalled.
	if err := d.Other.Do(ctx, d.Other.B().Del().Key(keys.LockKey(prefix, d.Cluster)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	res, err := gens.Sweep(ctx, d.Other, gens.Index{Live: prefix, Family: true}, gens.Options{Grace: 1})
	if err != nil {
		t.Fatalf("sweep without a group: %v", err)
	}
	var removed []int64
	for _, r := range res.Removed {
		removed = append(removed, r.Gen)
	}
	if !slices.Equal(removed, []int64{1}) {
		t.Fatalf("sweep without a group removed generations %v, want [1]", removed)
	}
	us := genUsers(30, 3)
	st, err := genRebuilder(t, d, prefix, rebuild.Options{Group: ga}).Run(ctx, genSource(us, -1, nil))
	if err != nil {
		t.Fatalf("Run in group a: %v", err)
	}
	// Above the floor: generation 1 was the run's without a group.
	g := st.Generations[prefix]
	if g != 2 {
		t.Errorf("group a's generation: got %d, want 2", g)
	}
	wantBuckets(t, d, prefix, g, us)
	close(resume)
	if err := <-done; !errors.Is(err, want) {
		t.Fatalf("the stalled run: got %v, want %v", err, want)
	}
	wantBuckets(t, d, prefix, g, us)
	if v, _ := redistest.Get(t, d.Other, keys.PointerKey(prefix, d.Cluster)); v != keys.GroupMarker(ga) {
		t.Errorf("pointer without a group: got %q, want %q", v, keys.GroupMarker(ga))
	}
	redistest.WantAbsent(t, d.Other, keys.LockKey(prefix, d.Cluster))
}
