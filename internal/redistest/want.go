package redistest

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"
)

// Clean deletes keys now and again when tb ends, so that a test starts and
// leaves them absent.
func Clean(tb testing.TB, c rueidis.Client, keys ...string) {
	tb.Helper()
	for _, k := range keys {
		Cmd(tb, c, "DEL", k)
	}
	tb.Cleanup(func() {
		for _, k := range keys {
			if err := c.Do(context.Background(), c.B().Del().Key(k).Build()).Error(); err != nil {
				tb.Errorf("cleanup: DEL %s: %v", k, err)
			}
		}
	})
}

// Fields returns n hash fields "f<i>" = "<gen>-<i>".
func Fields(gen string, n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m["f"+strconv.Itoa(i)] = gen + "-" + strconv.Itoa(i)
	}
	return m
}

// SeedHash replaces key with a hash of fields, without a TTL (an empty
// fields leaves key absent).
func SeedHash(tb testing.TB, c rueidis.Client, key string, fields map[string]string) {
	tb.Helper()
	Cmd(tb, c, "DEL", key)
	if len(fields) == 0 {
		return
	}
	cmd := c.B().Hset().Key(key).FieldValue()
	for _, f := range slices.Sorted(maps.Keys(fields)) {
		cmd = cmd.FieldValue(f, fields[f])
	}
	Do(tb, c, cmd.Build())
}

// WantHash fails tb unless key holds exactly want, and has no TTL when it
// exists: a live key never inherits an expiry.
func WantHash(tb testing.TB, c rueidis.Client, key string, want map[string]string) {
	tb.Helper()
	if diff := cmp.Diff(want, HGetAll(tb, c, key)); diff != "" {
		tb.Errorf("%s (-want +got):\n%s", key, diff)
	}
	if got := PTTL(tb, c, key); len(want) > 0 && got != -1 {
		tb.Errorf("%s: PTTL %v, want -1 (no expiry)", key, got)
	}
}

// WantAbsent fails tb if key exists.
func WantAbsent(tb testing.TB, c rueidis.Client, key string) {
	tb.Helper()
	if Exists(tb, c, key) {
		tb.Errorf("%s exists, want it absent", key)
	}
}

// WantTTL fails tb unless key exists with 0 < TTL <= max.
func WantTTL(tb testing.TB, c rueidis.Client, key string, max time.Duration) {
	tb.Helper()
	if got := PTTL(tb, c, key); got <= 0 || got > max {
		tb.Errorf("%s: PTTL %v, want in (0, %v]", key, got, max)
	}
}

// WantPTTL fails tb unless key's PTTL is in (lo, hi]. With lo = hi = -1
// the key must exist with no TTL.
func WantPTTL(tb testing.TB, c rueidis.Client, key string, lo, hi time.Duration) {
	tb.Helper()
	got := PTTL(tb, c, key)
	if lo == -1 && hi == -1 {
		if got != -1 {
			tb.Errorf("%s: PTTL %v, want -1 (no expiry)", key, got)
		}
		return
	}
	if got <= lo || got > hi {
		tb.Errorf("%s: PTTL %v, want in (%v, %v]", key, got, lo, hi)
	}
}

// WantString fails tb unless the string key holds want ("" = absent), such
// as a lock that holds a token.
func WantString(tb testing.TB, c rueidis.Client, key, want string) {
	tb.Helper()
	got, ok := Get(tb, c, key)
	switch {
	case want == "" && ok:
		tb.Errorf("%s = %q, want it absent", key, got)
	case want != "" && got != want:
		tb.Errorf("%s = %q (present %v), want %q", key, got, ok, want)
	}
}

// WantLock fails tb unless the lock key holds value ("" = absent) with a
// TTL of at most max.
func WantLock(tb testing.TB, c rueidis.Client, key, value string, max time.Duration) {
	tb.Helper()
	WantString(tb, c, key, value)
	if value != "" {
		WantTTL(tb, c, key, max)
	}
}

// WantErr fails tb at once unless errors.Is(err, target).
func WantErr(tb testing.TB, err, target error) {
	tb.Helper()
	if !errors.Is(err, target) {
		tb.Fatalf("err = %v, want errors.Is(err, %v)", err, target)
	}
}
