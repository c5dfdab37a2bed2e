package redistest

import (
	"context"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/scan"
	"github.com/redis/rueidis"
)

// Clear deletes every key of d whose name contains d's prefix (without the
// cluster's hash-tag braces, so that the keys of a tag of keyswap's own, a
// family's buckets spread over the slots and a run's counters are found
// too), on every master. A test calls it first, so that it starts without
// the keys an earlier run of it left: [Prefix] names the same keys in every
// run of go test -count=N.
func (d Deployment) Clear(tb testing.TB) {
	tb.Helper()
	ClearContaining(tb, d.Other, strings.Trim(d.Prefix, "{}"))
}

// ClearContaining deletes every key whose name contains s, on every master
// of c's deployment.
func ClearContaining(tb testing.TB, c rueidis.Client, s string) {
	tb.Helper()
	ctx := context.Background()
	for page, err := range scan.Pages(ctx, c, scan.Options{Match: "*" + scan.EscapeGlob(s) + "*"}) {
		if err != nil {
			tb.Fatalf("redistest: SCAN for keys containing %q: %v", s, err)
		}
		for _, k := range page {
			if err := c.Do(ctx, c.B().Unlink().Key(k).Build()).Error(); err != nil {
				tb.Fatalf("redistest: UNLINK %s: %v", k, err)
			}
		}
	}
}
