package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/keys"
	ksrun "github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
)

// publishArgs returns the arguments of a publish of temps onto lives with
// orphans, in publish.lua's layout, fenced by locks (all sharing token):
// locks, the record and the receipt of the first, the temp keys, the live
// keys, the orphans, one meta.
func publishArgs(locks []string, token string, temps, lives, orphans []string) []string {
	ks := append(slices.Clone(locks), locks[0]+":run", locks[0]+":done")
	ks = append(append(append(ks, temps...), lives...), orphans...)
	ks = append(ks, "meta")
	args := append([]string{"EVALSHA", publishScript.SHA1, strconv.Itoa(len(ks))}, ks...)
	args = append(args, token)
	for _, n := range []int{len(locks), 1, 1, len(temps), len(orphans), 0, 0, 1, 0} {
		args = append(args, strconv.Itoa(n))
	}
	return append(args, strings.Repeat("2", len(temps)), "3", "0", "60", "1700000000000")
}

func TestPublishLock(t *testing.T) {
	const live = keyPrefix + "family"
	lock := keys.LockKey(live, false)
	temp := func(bucket string) string { return keys.TempKey(live+":"+bucket, false, 1700000000, 42) }
	temps := []string{temp("a"), temp("b")}
	lives := []string{live + ":a", live + ":b"}
	good := publishArgs([]string{lock}, "tok", temps, lives, []string{live + ":c"})

	l, gotTemps, err := publishLock(good, 10*time.Second)
	if err != nil {
		t.Fatalf("publishLock: %v", err)
	}
	if l.Key != lock || l.Live != live || l.Token != "tok" || l.TTL != 10*time.Second {
		t.Errorf("lock: got %+v, want key %s, live %s, token tok, TTL 10s", l, lock, live)
	}
	if !slices.Equal(gotTemps, temps) {
		t.Errorf("temps: got %v, want %v", gotTemps, temps)
	}

	other := keys.TempKey("other", false, 1700000000, 42)
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"no key count", []string{"EVALSHA", "sha"}},
		{"bad key count", []string{"EVALSHA", "sha", "x"}},
		{"too few args", good[:len(good)-14]},
		{"two locks", publishArgs([]string{lock, keys.LockKey("other", false)}, "tok", temps, lives, nil)},
		{"foreign lock", publishArgs([]string{"other"}, "tok", temps, lives, nil)},
		{"foreign temp key", publishArgs([]string{lock}, "tok", []string{temps[0], other}, lives, nil)},
	} {
		if _, _, err := publishLock(tt.args, time.Second); err == nil {
			t.Errorf("%s: got no error, want one", tt.name)
		}
	}
}

// TestRenew reads a real publish's arguments, and renews its lease as the
// publish section does before letting it run: the bench must follow
// internal/protocol's layout.
func TestRenew(t *testing.T) {
	ctx := t.Context()
	srv, err := openServer(ctx, env.Standalone.Addr, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	if _, err := keyswapScripts(ctx, srv.admin, true); err != nil { // as the section does
		t.Fatal(err)
	}
	prefix := keyPrefix + "test-renew"
	const buckets = ksrun.RefreshChunk + 10 // two refresh scripts
	var rn renewal
	var rerr error
	calls := 0
	r := &runner{srv: srv}
	hooked := &publishHook{Client: srv.client, around: func(args []string, do func()) {
		calls++
		rn, _, rerr = r.renew(ctx, ksrun.New(srv.client, nil), args, rebuild.Defaults().TTL)
		do()
	}}
	rb, err := rebuild.New(hooked, rebuild.Options{}, builders.SetIndex(prefix, func(i int) (string, string, bool) {
		return fmt.Sprint("b", i%buckets), fmt.Sprint("m", i), true
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ks, _ := scanKeys(ctx, srv.admin, prefix+"*")
		for _, k := range ks {
			srv.admin.Do(ctx, srv.admin.B().Unlink().Key(k).Build())
		}
	})
	if _, err := rb.Run(ctx, sources.Seq(func(yield func(int) bool) {
		for i := range 3 * buckets {
			if !yield(i) {
				return
			}
		}
	})); err != nil {
		t.Fatal(err)
	}
	if calls != 1 || rerr != nil {
		t.Fatalf("renew before the publish: %d calls, %v; want 1, nil", calls, rerr)
	}
	if rn.Keys != buckets || rn.Scripts != 2 || rn.RefreshLongest <= 0 || rn.RefreshTotal < rn.RefreshLongest || rn.Heartbeat <= 0 {
		t.Errorf("renewal: got %+v, want %d keys in 2 scripts, with their times", rn, buckets)
	}
}

func TestPublishSummarize(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	sz := publishSize{Buckets: 1000, Items: 10000, Runs: []publishRun{
		{Publish: ms(4), Build: ms(100), Longest: []commandTime{{Command: "SCAN", Longest: ms(1), Calls: 2}}, Renewal: renewal{Keys: 1000, Scripts: 2, RefreshLongest: ms(1)},
			Commands: map[string]commandStat{"exec": {Calls: 2, Usec: 400}}},
		{Publish: ms(6), Build: ms(50), Longest: []commandTime{{Command: "SADD", Longest: ms(3), Calls: 5}, {Command: "SCAN", Longest: ms(2), Calls: 1}}},
		{Publish: ms(5), Build: ms(25), Commands: map[string]commandStat{"exec": {Calls: 4, Usec: 800}}},
	}}
	sz.summarize()
	s := sz.Summary
	if s.Publish != ms(5) || s.PublishMin != ms(4) || s.PublishMax != ms(6) || s.PerBucket != 5*time.Microsecond {
		t.Errorf("publish: got %v (%v–%v), %v per bucket; want 5ms (4ms–6ms), 5µs", s.Publish, s.PublishMin, s.PublishMax, s.PerBucket)
	}
	if s.BuildRate != 200000 || s.BuildRateMin != 100000 || s.BuildRateMax != 400000 {
		t.Errorf("build rate: got %v (%v–%v), want 200000 (100000–400000)", s.BuildRate, s.BuildRateMin, s.BuildRateMax)
	}
	want := []commandTime{
		{Command: "SADD", Longest: ms(3), Max: ms(3), Calls: 5},
		{Command: "SCAN", Longest: 1500 * time.Microsecond, Max: ms(2), Calls: 2}, // the median of the rounds it ran in
	}
	if !slices.Equal(s.Longest, want) {
		t.Errorf("longest: got %+v, want %+v (the median and the maximum of the longest calls, the most calls)", s.Longest, want)
	}
	if s.Renewal.Scripts != 2 || s.Renewal.RefreshLongest != 0 || s.RenewalMax.RefreshLongest != ms(1) || s.ExecCalls != 2 || s.ExecMean != 200*time.Microsecond {
		t.Errorf("renewal %+v (max %+v), exec %d × %v: want the median and the maximum of the rounds, and the median exec calls and mean", s.Renewal, s.RenewalMax, s.ExecCalls, s.ExecMean)
	}
}
