package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/internal/scan"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// TestRebuildKeysPattern pins which shapes of internal/keys status's SCAN
// MATCH asks Redis for: every key status reads, none of a generation's
// data keys nor a run's counters.
func TestRebuildKeysPattern(t *testing.T) {
	const stamp = 1735830245
	for _, tc := range []struct {
		key  string
		want bool
	}{
		{keys.LockKey("users:by-email", false), true},
		{keys.RecordKey(keys.LockKey("users:by-email", false)), true}, // read from the lock; dropped here
		{keys.MetaKey("users:by-email", false), true},
		{keys.PrevKey("users:by-email", false), true},
		{keys.RegistryKey("users:by-email", true), true},
		{keys.PointerKey("users:by-email", false), true},
		{keys.OwnerKey("users:by-email", true), true}, // the owner stamp (SPEC C104); dropped here
		{keys.TempKey("users:by-email", false, stamp, 0xfeed), true},
		{keys.TempKey("users:by-email", true, 10, 1), true},
		{"users:by-email:rebuild:1735830245", true}, // legacy shape
		{"users:by-email:rebuild:42", true},
		{keys.GenKey("users:by-email", 3), false},
		{keys.GenKey("users:by-email", 12345), false},
		{keys.GenBucketKey("users:by-country", 3, "fr"), false},
		{keys.GenBucketKey("users:by-country", 3, "x:rebuild-gens"), true}, // a bucket's name; cutGenSuffix drops it
		{keys.CounterKey("users:by-email", 7, 3), false},
		{keys.ManifestKey("users:by-email", false, 3), false},
		{keys.ManifestListKey("users:by-email", true, 3), false},
		// What a glob cannot keep apart from ":rebuild-g:": a timestamp
		// of one digit, which no run writes.
		{keys.TempKey("users:by-email", false, 9, 1), false},
		{"users:by-email:rebuild:9", false},
		{"users:by-email", false},
	} {
		if got := globMatch(rebuildKeysPattern, tc.key); got != tc.want {
			t.Errorf("%q matches %q: got %v, want %v", rebuildKeysPattern, tc.key, got, tc.want)
		}
	}
}

// TestStatusSkipsGenerationData runs status on servers of the test's own
// holding an index in Generations mode, beside 50,000 data keys of its
// family's current generation: status's report and table are those of the
// same server without them, and the SCAN replies hold every key of
// keyswap's but the data keys and nothing else, a few keys instead of
// 50,000.
func TestStatusSkipsGenerationData(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t)
	cl := redistest.OwnCluster(t, 3)
	clusterD := deployment{name: "cluster", cluster: true, client: cl.Client(t)}
	for _, a := range cl.Addrs {
		clusterD.redis = append(clusterD.redis, "-redis", "redis://"+a)
	}
	for _, d := range []deployment{
		{name: "standalone", redis: []string{"-redis", "redis://" + srv.Addr}, client: srv.Client(t)},
		clusterD,
	} {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			ix := newIndex(redistest.Prefix(t))
			genSetup(t, d, ix)
			orphan := keys.TempKey(ix.tag+":crashed", d.cluster, time.Now().Add(-2*time.Hour).Unix(), 0xfeed)
			do(t, d.client, "SADD", orphan, "x", "y")
			lock := keys.LockKey(ix.tag+":other", d.cluster)
			do(t, d.client, "SET", lock, "0123456789abcdef0123456789abcdef")

			var mu sync.Mutex
			var returned []string
			counted := rueidishook.WithHook(d.client, redistest.Hook{
				OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
					isScan := strings.EqualFold(cmd.Commands()[0], "SCAN")
					r := c.Do(ctx, cmd)
					if e, err := r.AsScanEntry(); isScan && err == nil {
						mu.Lock()
						returned = append(returned, e.Elements...)
						mu.Unlock()
					}
					return r
				},
			})
			now := time.Now()
			snapshot := func() (*statusReport, string, []string) {
				t.Helper()
				returned = nil
				rep, err := collectStatus(ctx, counted, "", time.Hour, time.Hour, false, now)
				if err != nil {
					t.Fatalf("status: %v", err)
				}
				var out bytes.Buffer
				if err := writeStatus(&out, rep); err != nil {
					t.Fatal(err)
				}
				return rep, out.String(), returned
			}
			before, beforeOut, _ := snapshot()

			const data = 50_000
			var cmds rueidis.Commands
			for i := range data {
				cmds = append(cmds, d.client.B().Set().Key(keys.GenBucketKey(ix.country, 3, fmt.Sprint("b", i))).Value("x").Build())
				if len(cmds) == 1000 || i == data-1 {
					for _, r := range d.client.DoMulti(ctx, cmds...) {
						if err := r.Error(); err != nil {
							t.Fatalf("SET: %v", err)
						}
					}
					cmds = nil
				}
			}

			after, afterOut, got := snapshot()
			if !reflect.DeepEqual(after, before) || afterOut != beforeOut {
				t.Errorf("status with %d data keys more: got\n%s\nwant\n%s", data, afterOut, beforeOut)
			}
			for _, want := range []string{ix.email, ix.country, lock, orphan} {
				if !strings.Contains(afterOut, "\n"+want+" ") {
					t.Errorf("status: no row for %s in\n%s", want, afterOut)
				}
			}
			if len(after.Indexes) != 2 || after.Indexes[0].Gens == nil || after.Indexes[1].Gens == nil {
				t.Errorf("indexes: got %+v, want %s and %s in Generations mode", after.Indexes, ix.email, ix.country)
			}

			// What SCAN sent: every key whose name holds ":rebuild" but
			// the data keys and the manifests, each once at least.
			var all, genData int
			var want []string
			for page, err := range scan.Pages(ctx, d.client, scan.Options{}) {
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range page {
					all++
					if keys.IsGenKey(k) || keys.IsManifestKey(k) {
						genData++
					} else if strings.Contains(k, ":rebuild") {
						want = append(want, k)
					}
				}
			}
			distinct := slices.Sorted(maps.Keys(set(got)))
			if slices.Sort(want); !slices.Equal(distinct, want) {
				t.Errorf("SCAN returned %d keys, %d distinct: %q; want %q", len(got), len(distinct), distinct, want)
			}
			t.Logf("%d keys in the keyspace, %d of them generations' data; status's SCAN returned %d", all, genData, len(got))
		})
	}
}

// TestStatusIgnoresOwnerStamp: the owner stamps of bases (SPEC C104),
// which every run leaves, are neither indexes, locks nor temp keys to
// status: a server holding only stamps reports nothing.
func TestStatusIgnoresOwnerStamp(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t)
	c := srv.Client(t)
	for _, live := range []string{"users:by-email", "{users}:by-country", "a}b"} {
		do(t, c, "SET", keys.OwnerKey(live, false), live)
		do(t, c, "SET", keys.OwnerKey(live, true), live)
	}
	rep, err := collectStatus(t.Context(), c, "", time.Hour, time.Hour, false, time.Now())
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	if len(rep.Locks)+len(rep.Indexes)+len(rep.TempKeys)+len(rep.Runs) > 0 {
		t.Errorf("status of a server holding only owner stamps: got %+v, want nothing", rep)
	}
}

// set returns the set of ks.
func set(ks []string) map[string]bool {
	out := make(map[string]bool, len(ks))
	for _, k := range ks {
		out[k] = true
	}
	return out
}
