package reliability

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// TestGenerationsDataKeyDeleted (C85, C94): mid-write, an operator deletes a
// bucket the run already wrote in its generation. The run must not flip
// to a generation missing it: it fails with ErrTempKeyLost naming the key,
// and the old generation stays current.
func TestGenerationsDataKeyDeleted(t *testing.T) {
	t.Parallel()
	gDeployments(t, func(t *testing.T, g *gCase) {
		old := g.seed(t)
		// The first bucket of generation 2 that the 3rd write transaction
		// finds written (on a cluster the writes go in slot order).
		deleted := ""
		hooked := gHook(g.client, gHooks{afterBatch: func(n int) {
			if n != 3 {
				return
			}
			for b := range gBuckets {
				if bucket := keys.GenBucketKey(g.prefix, 2, fmt.Sprintf("b%02d", b)); redistest.Exists(t, g.admin, bucket) {
					deleted = bucket
					redistest.Do(t, g.admin, g.admin.B().Del().Key(bucket).Build())
					return
				}
			}
		}})
		updated := gItems("new", gEntries, gBuckets)
		_, err := g.rebuilder(t, hooked, rebuild.Options{}).Run(redistest.Ctx(t), sources.Slice(updated))
		if deleted == "" {
			t.Fatal("no bucket of generation 2 written after 3 write transactions")
		}
		if !errors.Is(err, rebuild.ErrTempKeyLost) || !strings.Contains(err.Error(), deleted) {
			t.Fatalf("Run = %v, want ErrTempKeyLost naming %s", err, deleted)
		}
		g.failedRun(t, old)
	})
}

// TestGenerationsDataKeyWrittenByAnother (C85, C94): mid-write, another
// client adds a member to a bucket of the generation the run builds. The
// run must not flip to a generation holding what its source does not: it
// fails with ErrTampered, and the old generation stays current.
func TestGenerationsDataKeyWrittenByAnother(t *testing.T) {
	t.Parallel()
	gDeployments(t, func(t *testing.T, g *gCase) {
		old := g.seed(t)
		bucket := keys.GenBucketKey(g.prefix, 2, "b01")
		hooked := gHook(g.client, gHooks{afterBatch: func(n int) {
			if n == 3 {
				redistest.Do(t, g.admin, g.admin.B().Sadd().Key(bucket).Member("intruder").Build())
			}
		}})
		_, err := g.rebuilder(t, hooked, rebuild.Options{}).Run(redistest.Ctx(t), sources.Slice(gItems("new", gEntries, gBuckets)))
		if !errors.Is(err, rebuild.ErrTampered) {
			t.Fatalf("Run = %v, want ErrTampered", err)
		}
		g.failedRun(t, old)
	})
}
