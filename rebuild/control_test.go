package rebuild_test

import (
	"context"
	"fmt"
	"iter"
	"slices"
	"strconv"
	"testing"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
)

// TestControlRate: the status a heartbeat writes (its "rate", the items per
// second so far) is not read back as an operator's limit, and an
// operator's max_rate request, in the run's requests ("<lock>:ctl"), is. A run without a limit reports limit 0
// after several heartbeats; after protocol.Control sets max_rate, the next
// heartbeats report that limit; then the source ends and the run publishes.
func TestControlRate(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "control:by-email"
		release := make(chan struct{})
		src := func(ctx context.Context) iter.Seq2[user, error] {
			return func(yield func(user, error) bool) {
				for _, u := range users(100) {
					if !yield(u, nil) {
						return
					}
				}
				select { // the run goes on, heartbeats and all, until released
				case <-release:
				case <-ctx.Done():
				}
			}
		}
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{},
			builders.Hash(key, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
		done := make(chan error, 1)
		go func() {
			_, err := r.Run(context.Background(), src)
			done <- err
		}()
		defer func() {
			close(release)
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			if got := redistest.HGetAll(t, d.Other, key); len(got) != 100 {
				t.Errorf("published %d fields, want 100", len(got))
			}
		}()
		record := keys.RecordKey(keys.LockKey(key, d.Cluster))
		// beats waits until the record shows n heartbeats more than when
		// called (each writes its time, in ms, as beat_at), and returns it.
		beats := func(n int) map[string]string {
			t.Helper()
			var rec map[string]string
			last, seen := redistest.HGetAll(t, d.Other, record)["beat_at"], 0
			waitFor(t, fmt.Sprintf("%d heartbeats", n), func() bool {
				rec = redistest.HGetAll(t, d.Other, record)
				if b := rec["beat_at"]; b != last {
					last, seen = b, seen+1
				}
				return seen >= n
			})
			return rec
		}
		rec := beats(3)
		if rec["rate"] == "" || rec["rate"] == "0.0" || rec["limit"] != "0" {
			t.Errorf("after 3 heartbeats: rate %q, limit %q; want a rate and limit 0 (no limit)", rec["rate"], rec["limit"])
		}
		rr := protocol.New(d.Other, nil)
		info, err := rr.Operator.FindRun(t.Context(), key)
		if err != nil {
			t.Fatalf("FindRun: %v", err)
		}
		if err := rr.Operator.Control(t.Context(), info, "max_rate", "250"); err != nil {
			t.Fatalf("Control: %v", err)
		}
		rec = beats(2)
		ctl := redistest.HGetAll(t, d.Other, keys.CtlKey(info.Lock))
		if rec["limit"] != "250" || ctl["max_rate"] != "250" || ctl["token"] != info.Token {
			t.Errorf("after max_rate 250: limit %q, requests %q; want 250, and max_rate 250 for the run's token", rec["limit"], ctl)
		}
		// C74: operators write the requests, never the record.
		if _, ok := rec["max_rate"]; ok {
			t.Errorf("the record %s has max_rate: the request was written into it", record)
		}
	})
}

// TestStatusRateNow: a run's heartbeat writes its current rate (rate_now,
// over about the last five seconds) next to its average since the start
// (rate), and its ETA at the current rate. Unthrottled from an endless
// source until it has pulled a few thousand items, then throttled by an
// operator to 50 items/s, the run's current rate falls to about 50 while
// its average stays far above; paused, its current rate falls to 0 and
// its ETA is unknown, while its average is still positive. Every field
// of the record is one that record.go names.
func TestStatusRateNow(t *testing.T) {
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "ratenow:by-email"
		finish, yielded := endlessRun(t, d.Client, key, rebuild.Options{BatchSize: 100, Expected: 1 << 40})
		record := keys.RecordKey(keys.LockKey(key, d.Cluster))
		var rec map[string]string
		wait := func(what string, cond func(rateNow, rate float64) bool) {
			t.Helper()
			waitFor(t, what, func() bool {
				rec = redistest.HGetAll(t, d.Other, record)
				parsed, err := protocol.ParseRecord(rec)
				if err != nil {
					t.Fatalf("the record %v: %v", rec, err)
				}
				return parsed.RateNow != nil && cond(*parsed.RateNow, parsed.Rate)
			})
		}
		num := func(field string) float64 {
			t.Helper()
			f, err := strconv.ParseFloat(rec[field], 64)
			if err != nil {
				t.Fatalf("record field %s: %q", field, rec[field])
			}
			return f
		}

		wait("3000 items at more than 500 items/s", func(rateNow, _ float64) bool { return num("items") >= 3000 && rateNow > 500 })
		for f := range rec {
			if !slices.Contains(protocol.RecordFields, f) {
				t.Errorf("the record has the field %q, which record.go does not name", f)
			}
		}
		if rec["eta"] == "" {
			t.Errorf("a running run with Expected: eta %q, want one", rec["eta"])
		}

		rr := protocol.New(d.Other, nil)
		info, err := rr.Operator.FindRun(t.Context(), key)
		if err != nil {
			t.Fatalf("FindRun: %v", err)
		}
		if err := rr.Operator.Control(t.Context(), info, protocol.CtlMaxRate, "50"); err != nil {
			t.Fatalf("Control: %v", err)
		}
		// The average cannot fall to 50 items/s: the run pulled 3000 items
		// at more than 500/s before.
		wait("a current rate of at most 60 items/s", func(rateNow, _ float64) bool { return rateNow <= 60 })
		if rate, now := num("rate"), num("rate_now"); rate <= 2*now || now == 0 {
			t.Errorf("throttled to 50/s: rate %v, rate_now %v; want the current rate positive and the average well above it", rate, now)
		}

		if err := rr.Operator.Control(t.Context(), info, protocol.CtlPaused, "1"); err != nil {
			t.Fatalf("Control: %v", err)
		}
		// The heartbeat after the one that read the pause has no ETA, while
		// its current rate still counts the items of the seconds before.
		// The third heartbeat since the record was last read is such a
		// one: the first may have run before the request was written.
		last, beats := rec["beat_at"], 0
		wait("three heartbeats", func(float64, float64) bool {
			if rec["beat_at"] != last {
				last, beats = rec["beat_at"], beats+1
			}
			return beats >= 3
		})
		if rec["eta"] != "" {
			t.Errorf("paused: eta %q (rate_now %q), want none", rec["eta"], rec["rate_now"])
		}
		wait("a current rate of 0", func(rateNow, _ float64) bool { return rateNow == 0 })
		if rec["rate_now"] != "0.0" || num("rate") <= 0 || rec["eta"] != "" {
			t.Errorf("paused: rate_now %q, rate %q, eta %q; want 0.0, a positive average and no ETA", rec["rate_now"], rec["rate"], rec["eta"])
		}
		if err := rr.Operator.Control(t.Context(), info, protocol.CtlPaused, ""); err != nil {
			t.Fatalf("Control: %v", err)
		}
		if err := finish(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		wantEndless(t, d.Other, key, yielded.Load())
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}
