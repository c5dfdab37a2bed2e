package store_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
)

// benchFields is the size of the hashes BenchmarkSwap1M swaps.
const benchFields = 1_000_000

// benchHash replaces key with a hash of benchFields fields, written as HSETs
// of 1000 fields each in one pipeline.
func benchHash(b *testing.B, c rueidis.Client, key, gen string) {
	b.Helper()
	ctx := context.Background()
	if err := c.Do(ctx, c.B().Del().Key(key).Build()).Error(); err != nil {
		b.Fatal(err)
	}
	const perCmd = 1000
	cmds := make(rueidis.Commands, 0, benchFields/perCmd)
	for i := 0; i < benchFields; i += perCmd {
		cmd := c.B().Hset().Key(key).FieldValue()
		for j := i; j < i+perCmd; j++ {
			f := strconv.Itoa(j)
			cmd = cmd.FieldValue("f"+f, gen+f)
		}
		cmds = append(cmds, cmd.Build())
	}
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			b.Fatal(err)
		}
	}
	benchHlen(b, c, key)
}

// benchHlen fails unless key is a hash of benchFields fields.
func benchHlen(b *testing.B, c rueidis.Client, key string) {
	b.Helper()
	n, err := c.Do(context.Background(), c.B().Hlen().Key(key).Build()).AsInt64()
	if err != nil || n != benchFields {
		b.Fatalf("HLEN %s = %d, %v; want %d", key, n, err, benchFields)
	}
}

// benchSlowlog returns the server-side duration of the one command in the
// slow log whose name is one of names, and fails unless there is exactly
// one. SLOWLOG entries are [id, unix time, duration in µs, [args...], ...].
func benchSlowlog(b *testing.B, c rueidis.Client, names ...string) time.Duration {
	b.Helper()
	entries, err := c.Do(context.Background(), c.B().SlowlogGet().Count(-1).Build()).ToArray()
	if err != nil {
		b.Fatal(err)
	}
	var found []time.Duration
	for _, e := range entries {
		fields, err := e.ToArray()
		if err != nil || len(fields) < 4 {
			b.Fatalf("malformed SLOWLOG entry %v", e)
		}
		args, err := fields[3].AsStrSlice()
		if err != nil || len(args) == 0 {
			b.Fatalf("malformed SLOWLOG args %v", fields[3])
		}
		for _, name := range names {
			if strings.EqualFold(args[0], name) {
				us, err := fields[2].AsInt64()
				if err != nil {
					b.Fatal(err)
				}
				found = append(found, time.Duration(us)*time.Microsecond)
			}
		}
	}
	if len(found) != 1 {
		b.Fatalf("SLOWLOG has %d entries for %v, want 1", len(found), names)
	}
	return found[0]
}

// benchDo runs one command and fails on error.
func benchDo(b *testing.B, c rueidis.Client, cmd rueidis.Completed) {
	b.Helper()
	if err := c.Do(context.Background(), cmd).Error(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSwap1M compares, on the server, the fenced swap of a 1M-field
// hash over another (UNLINK then RENAME in the publish script, C23+) with a
// plain RENAME over it, which frees the old value synchronously. The
// server-side durations come from SLOWLOG, on a server of the benchmark's
// own with slowlog-log-slower-than 0.
func BenchmarkSwap1M(b *testing.B) {
	srv := redistest.OwnServer(b, "--slowlog-log-slower-than", "0", "--slowlog-max-len", "1024")
	c := srv.Client(b)
	ctx := context.Background()
	// Load the publish script, so that the swap is one EVALSHA, as in
	// steady state, and not a NOSCRIPT reply followed by an EVAL.
	benchDo(b, c, c.B().ScriptLoad().Script(redistest.ScriptNamed("publish").Source).Build())
	s := store.New(c, store.Options{})
	const live = "bench:idx"
	var swapTotal, renameTotal time.Duration

	for b.Loop() {
		// (a) The fenced swap, as WithRebuild runs it.
		b.StopTimer()
		benchHash(b, c, live, "old-")
		lock, err := s.Acquire(ctx, live, 600*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		temp := s.NewTempKey(live)
		benchHash(b, c, temp, "new-")
		benchDo(b, c, c.B().SlowlogReset().Build())
		b.StartTimer()

		outcome, err := s.Swap(ctx, temp, live, store.SwapOptions{Lock: lock, Populated: store.PopulatedYes})

		b.StopTimer()
		if err != nil || outcome != store.Swapped {
			b.Fatalf("Swap = %v, %v; want %v", outcome, err, store.Swapped)
		}
		swapTotal += benchSlowlog(b, c, "EVALSHA")
		benchHlen(b, c, live)
		if err := s.Release(ctx, lock); err != nil {
			b.Fatal(err)
		}

		// (b) A plain RENAME over the live key.
		benchHash(b, c, live, "old-")
		temp = s.NewTempKey(live)
		benchHash(b, c, temp, "new-")
		benchDo(b, c, c.B().SlowlogReset().Build())
		b.StartTimer()

		err = c.Do(ctx, c.B().Rename().Key(temp).Newkey(live).Build()).Error()

		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		renameTotal += benchSlowlog(b, c, "RENAME")
		benchHlen(b, c, live)
		b.StartTimer()
	}
	b.ReportMetric(float64(swapTotal.Microseconds())/float64(b.N), "swap-server-µs")
	b.ReportMetric(float64(renameTotal.Microseconds())/float64(b.N), "rename-server-µs")
}
