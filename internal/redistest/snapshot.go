package redistest

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/scan"
	"github.com/redis/rueidis"
)

// KeyState is one key's exact value (its DUMP serialisation) and its PTTL.
type KeyState struct {
	Dump string
	PTTL time.Duration // -1: no expiry
}

// Keys returns the keys whose names start with prefix, on every master of
// c's deployment, sorted. It scans with SCAN, so it suits test keyspaces.
func Keys(tb testing.TB, c rueidis.Client, prefix string) []string {
	tb.Helper()
	ctx := context.Background()
	seen := map[string]bool{}
	for addr, node := range c.Nodes() {
		if role, err := node.Do(ctx, node.B().Role().Build()).ToArray(); err == nil && len(role) > 0 {
			if r, _ := role[0].ToString(); r != "master" {
				continue
			}
		}
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(scan.EscapeGlob(prefix)+"*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				tb.Fatalf("redistest: SCAN %s on %s: %v", prefix, addr, err)
			}
			for _, k := range e.Elements {
				seen[k] = true
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// LiveKeys is [Keys] without the keys keyswap keeps next to live keys
// (locks, records, temp keys, generations, kept previous values): the live
// keys under prefix, such as the buckets of a family.
func LiveKeys(tb testing.TB, c rueidis.Client, prefix string) []string {
	tb.Helper()
	var out []string
	for _, k := range Keys(tb, c, prefix) {
		if !keys.Reserved(k) {
			out = append(out, k)
		}
	}
	return out
}

// Snapshot returns the exact state of every key starting with prefix, to
// compare before and after a rebuild that must leave them byte-identical.
// PTTLs are rounded down to seconds, so that a comparison tolerates the
// time between two snapshots but not a changed expiry.
func Snapshot(tb testing.TB, c rueidis.Client, prefix string) map[string]KeyState {
	tb.Helper()
	ctx := context.Background()
	out := map[string]KeyState{}
	for _, k := range Keys(tb, c, prefix) {
		dump, err := c.Do(ctx, c.B().Dump().Key(k).Build()).ToString()
		if rueidis.IsRedisNil(err) {
			continue // deleted since SCAN
		}
		if err != nil {
			tb.Fatalf("redistest: DUMP %s: %v", k, err)
		}
		pttl, err := c.Do(ctx, c.B().Pttl().Key(k).Build()).AsInt64()
		if err != nil {
			tb.Fatalf("redistest: PTTL %s: %v", k, err)
		}
		d := time.Duration(pttl)
		if pttl >= 0 {
			d = (time.Duration(pttl) * time.Millisecond).Truncate(time.Second)
		}
		out[k] = KeyState{Dump: dump, PTTL: d}
	}
	return out
}

// Leftovers returns the keys starting with prefix that a finished rebuild
// must not leave behind: temp keys, locks, and the records, logs and
// receipts kept next to locks. (A live key's generation, its meta key, is
// meant to stay; so is a previous value kept for a rollback, with its TTL.)
func Leftovers(tb testing.TB, c rueidis.Client, prefix string) []string {
	tb.Helper()
	var out []string
	for _, k := range Keys(tb, c, prefix) {
		if keys.Reserved(k) && !strings.HasSuffix(k, keys.MetaSuffix) && !strings.HasSuffix(k, keys.PrevSuffix) && !IsOwnerStamp(tb, c, k) {
			out = append(out, k)
		}
	}
	return out
}

// IsOwnerStamp reports whether k is the owner stamp of a base (SPEC
// C104), which a run in Generations mode leaves on a cluster, and none
// removes: a string naming a live key whose base another key can have
// (keys.Aliasable) and whose owner key on a cluster is k.
func IsOwnerStamp(tb testing.TB, c rueidis.Client, k string) bool {
	tb.Helper()
	if !strings.HasSuffix(k, keys.OwnerSuffix) {
		return false
	}
	v, err := c.Do(context.Background(), c.B().Get().Key(k).Build()).ToString()
	if err != nil {
		return false
	}
	return keys.Aliasable(v, true) && keys.OwnerKey(v, true) == k
}

// OwnerStamps returns the owner stamps (SPEC C104) that runs in
// Generations mode of lives leave: on a cluster, one for each live key
// whose base another key can have (keys.Aliasable); none on a standalone
// server, nor for a key with a hash tag of its own.
func OwnerStamps(cluster bool, lives ...string) []string {
	var out []string
	for _, l := range lives {
		if keys.Aliasable(l, cluster) {
			out = append(out, keys.OwnerKey(l, cluster))
		}
	}
	return out
}
