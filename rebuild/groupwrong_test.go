package rebuild_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/reader"
	"github.com/keyswap/keyswap/rebuild"
)

// TestGroupClaimWrongGroupRefused (C102): on an index group a claimed,
// everything of group b finds no pointer of its group; it reads the
// pointer without a group then, and refuses group a's claim with
// ErrGroupConflict naming group a, rather than using the keys in the
// rename-in-place shape, which nobody reads: Apply, Rollback, a reader
// (Resolve and Recheck). An Apply in RenameInPlace mode (no group) is
// refused too. Nothing is written; a reader of group a still reads group
// a's generation, and a reader of group b reads the plain shape of an
// index nobody claimed.
func TestGroupClaimWrongGroupRefused(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ga, gb, _ := fenceNames(d)
		prefix := taggedFencePrefix(d) // the RenameInPlace Apply's keys in one slot
		us := genUsers(50, 5)
		publishInGroup(t, d, prefix, ga, us)
		before := dumps(t, d)
		says := []string{fmt.Sprintf("in group %q", ga), fmt.Sprintf("not %q", gb)}
		b := genRebuilder(t, d, prefix, rebuild.Options{Group: gb})
		extra := genUsers(52, 5)[51]
		// Each refusal in a subtest of its own: nothing changes in between.
		t.Run("apply", func(t *testing.T) {
			wantGroupConflict(t, "Apply in group b", b.Apply(ctx, index.Insert(extra)), says...)
		})
		t.Run("rollback", func(t *testing.T) {
			_, err := b.Rollback(ctx)
			wantGroupConflict(t, "Rollback in group b", err, says...)
		})
		t.Run("rename-in-place-apply", func(t *testing.T) {
			inPlace := redistest.Rebuilder(t, d.Client, rebuild.Options{}, genSetIndex(prefix))
			wantGroupConflict(t, "Apply in RenameInPlace mode", inPlace.Apply(ctx, index.Insert(extra)), fmt.Sprintf("in group %q", ga))
		})
		wantDumps(t, d, before)

		rb, err := reader.New(d.Other, reader.Options{Group: gb})
		if err != nil {
			t.Fatal(err)
		}
		t.Run("reader", func(t *testing.T) {
			for range 2 { // the second through the cache
				got, err := rb.Bucket(ctx, prefix, extra.Country)
				wantGroupConflict(t, fmt.Sprintf("reader in group b: Bucket = %q", got), err, fmt.Sprintf("Options.Group %q", ga), fmt.Sprintf("not %q", gb))
			}
			_, _, err = rb.Recheck(ctx, reader.InBucket(prefix, "b00"), prefix+":b00")
			wantGroupConflict(t, "Recheck in group b", err, fmt.Sprintf("Options.Group %q", ga))
		})
		// An index nobody claimed: the plain shape.
		free := "{" + strings.Trim(d.Prefix, "{}") + "}free"
		if got, err := rb.Bucket(ctx, free, "b00"); err != nil || got != free+":b00" {
			t.Errorf("reader in group b, an index nobody claimed: Bucket = %q, %v; want %q", got, err, free+":b00")
		}
		ra, err := reader.New(d.Other, reader.Options{Group: ga})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := ra.Bucket(ctx, prefix, "b00"); err != nil || got != keys.GenBucketKey(prefix, 1, "b00") {
			t.Errorf("reader in group a: Bucket = %q, %v; want generation 1's", got, err)
		}
		wantBuckets(t, d, prefix, 1, us)
	})
}
