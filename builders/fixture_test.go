package builders_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
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

// users returns n users (redistest.Users).
func users(n int) []user { return redistest.Users(n) }

// mustRun runs a Rebuilder of bs over src and fails the test on error.
func mustRun[T any](t *testing.T, c rueidis.Client, opts rebuild.Options, src []T, bs ...rebuild.Builder[T]) rebuild.Stats {
	t.Helper()
	stats, err := redistest.Rebuilder(t, c, opts, bs...).Run(redistest.Ctx(t), rebuild.FromSlice(src))
	if err != nil {
		t.Fatalf("Run: got error %v, want nil", err)
	}
	return stats
}

// contents is the logical state of every key under a prefix: the key (less
// the prefix) → its type and contents in a canonical form, with "ttl" when
// it has an expiry. Unlike DUMP it does not depend on insertion order, so
// runs that write the same entries in a different order compare equal.
func contents(t *testing.T, c rueidis.Client, prefix string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, k := range redistest.Keys(t, c, prefix) {
		if strings.HasSuffix(k, keys.MetaSuffix) {
			continue // a generation: it differs between runs by design
		}
		typ, err := c.Do(ctx, c.B().Type().Key(k).Build()).ToString()
		if err != nil {
			t.Fatalf("TYPE %s: %v", k, err)
		}
		var v string
		switch typ {
		case "hash":
			h := redistest.HGetAll(t, c, k)
			v = fmt.Sprint(h) // fmt prints maps sorted by key
		case "zset":
			v = fmt.Sprint(redistest.ZScores(t, c, k))
		case "set":
			v = fmt.Sprint(redistest.SMembers(t, c, k))
		case "string":
			s, err := c.Do(ctx, c.B().Get().Key(k).Build()).ToString()
			if err != nil {
				t.Fatalf("GET %s: %v", k, err)
			}
			v = fmt.Sprintf("%q", s)
		default:
			t.Fatalf("contents: key %s has type %q, which this helper does not read", k, typ)
		}
		if ttl, err := c.Do(ctx, c.B().Pttl().Key(k).Build()).AsInt64(); err != nil {
			t.Fatalf("PTTL %s: %v", k, err)
		} else if ttl >= 0 {
			v += " ttl"
		}
		out[k[len(prefix):]] = typ + " " + v
	}
	return out
}

// sortedKeys returns m's keys in order, for stable failure messages.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
