package gens_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
)

// TestSweepBlocksRedisBriefly sweeps a retired generation of 200,000 small
// keys and one set of 500,000 members on a server of the test's own that
// logs every command in its SLOWLOG, and checks the shape of each command
// the sweep sent, which is what bounds how long it blocks Redis: every
// SCAN asks for at most DefaultScanCount keys, no script call deletes more
// than MaxUnlink keys, and no key is deleted with DEL (UNLINK frees a large
// value, such as the 500,000-member set, in the background). It logs the
// longest server-side durations; how long they are on a given machine is
// measured by the bench's generations section, not asserted here.
func TestSweepBlocksRedisBriefly(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t, "--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000")
	c := srv.Client(t)
	ctx := redistest.Ctx(t)
	idx := gens.Index{Live: "big", Family: true}
	const small, members = 200_000, 500_000
	do := func(cmd rueidis.Completed) {
		if err := c.Do(ctx, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < small; i += 1000 {
		cmd := c.B().Mset().KeyValue()
		for j := i; j < i+1000; j++ {
			cmd = cmd.KeyValue(keys.GenBucketKey(idx.Live, 1, "b"+strconv.Itoa(j)), "v")
		}
		do(cmd.Build())
	}
	big := keys.GenBucketKey(idx.Live, 1, "large")
	for i := 0; i < members; i += 10_000 {
		ms := make([]string, 10_000)
		for j := range ms {
			ms[j] = "member-" + strconv.Itoa(i+j)
		}
		do(c.B().Sadd().Key(big).Member(ms...).Build())
	}
	redistest.Cmd(t, c, "HSET", keys.RegistryKey(idx.Live, false), keys.RegNext, "2", "1", retired(time.Unix(1, 0)), "2", keys.RegCurrent)
	redistest.Cmd(t, c, "SET", keys.PointerKey(idx.Live, false), "2")
	if err := c.Do(ctx, c.B().SlowlogReset().Build()).Error(); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	res, err := gens.Sweep(ctx, c, idx, gens.Options{})
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != 1 || res.Keys != small+1 {
		t.Fatalf("result %+v, want generation 1 removed with %d keys", res, small+1)
	}
	if n, err := c.Do(ctx, c.B().Dbsize().Build()).AsInt64(); err != nil || n != 2 {
		t.Errorf("DBSIZE = %d, %v; want 2 (the pointer and the registry)", n, err)
	}

	entries, err := c.Do(context.Background(), c.B().SlowlogGet().Count(-1).Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	var longest time.Duration
	var longestCmd string
	counts := map[string]int{}
	longestOf := map[string]time.Duration{}
	var scans []time.Duration
	for _, e := range entries {
		fields, err := e.ToArray()
		if err != nil || len(fields) < 4 {
			t.Fatalf("malformed SLOWLOG entry %v", e)
		}
		args, err := fields[3].AsStrSlice()
		if err != nil || len(args) == 0 {
			t.Fatalf("malformed SLOWLOG args %v", fields[3])
		}
		name := strings.ToUpper(args[0])
		if name == "SLOWLOG" {
			continue
		}
		counts[name]++
		us, err := fields[2].AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		longestOf[name] = max(longestOf[name], time.Duration(us)*time.Microsecond)
		if name == "SCAN" {
			scans = append(scans, time.Duration(us)*time.Microsecond)
		}
		if d := time.Duration(us) * time.Microsecond; d > longest {
			longest, longestCmd = d, name
		}
		if name == "DEL" {
			t.Errorf("the sweep sent DEL %v: a large value would be freed while Redis waits; want UNLINK", args[1:])
		}
		if name == "SCAN" {
			if i := slices.IndexFunc(args, func(a string) bool { return strings.EqualFold(a, "COUNT") }); i < 0 || i+1 >= len(args) {
				t.Errorf("SCAN %v without COUNT: want at most %d keys per call", args[1:], gens.DefaultScanCount)
			} else if n, err := strconv.Atoi(args[i+1]); err != nil || n > gens.DefaultScanCount {
				t.Errorf("SCAN %v: COUNT %s, want at most %d", args[1:], args[i+1], gens.DefaultScanCount)
			}
		}
		if (name == "EVALSHA" || name == "EVAL") && len(args) > 2 {
			if n, _ := strconv.Atoi(args[2]); n-3 > gens.MaxUnlink {
				t.Errorf("a script call deleted up to %d keys, want at most %d", n-3, gens.MaxUnlink)
			}
		}
	}
	if counts["SCAN"] == 0 || counts["EVALSHA"]+counts["EVAL"] == 0 {
		t.Errorf("the sweep's commands %v: want SCANs and script calls, each checked above", counts)
	}
	if len(entries) >= 100_000 {
		t.Errorf("SLOWLOG is full (%d entries): some commands of the sweep were not checked", len(entries))
	}
	slices.Sort(scans)
	pct := func(p int) time.Duration {
		if len(scans) == 0 {
			return 0
		}
		return scans[(len(scans)-1)*p/100]
	}
	t.Logf("swept %d keys in %v with %v; the longest command took %v on the server (%s); longest of each: %v; SCAN COUNT %d: median %v, p99 %v, max %v",
		res.Keys, elapsed.Round(time.Millisecond), counts, longest, longestCmd, longestOf,
		gens.DefaultScanCount, pct(50), pct(99), pct(100))
}
