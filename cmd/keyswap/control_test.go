package main

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"testing"

	"github.com/keyswap/keyswap/internal/scan"
	krebuild "github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/store"
)

// TestCancel cancels a run in progress through the family's prefix, a key
// of the run other than its first: the run stops with ErrAborted, the live
// keys of an earlier publish are byte-identical, and nothing of the run is
// left. A second cancel finds no run.
func TestCancel(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ix := newIndex(testPrefix(t, d))
			v1 := people(0, 6)
			ix.publish(t, d, krebuild.Options{}, v1)
			before := ix.liveState(t, d)

			src := newEndless()
			run := startRun(t, ix.rebuilder(t, d, krebuild.Options{MaxRate: 200}), src.source)
			ix.waitRecord(t, d, "items pulled", func(rec map[string]string) bool { return atoi(rec["items"]) > 0 })
			token := ix.token(t, d)

			r := keyswap(t, d.args("cancel", ix.country)...)
			r.wantCode(t, exitOK)
			if want := "cancel requested for the " + ix.describeRun(token) + "; it stops at its next heartbeat, within a second, and publishes nothing\n"; r.stdout != want || r.stderr != "" {
				t.Errorf("got stdout %q, stderr %q; want stdout %q", r.stdout, r.stderr, want)
			}
			_, err := run.wait(t)
			if !errors.Is(err, krebuild.ErrAborted) {
				t.Fatalf("Run: got %v, want ErrAborted", err)
			}
			ix.wantLiveState(t, d, before)
			ix.wantLive(t, d, v1)
			ix.wantNoLeftovers(t, d)

			r = keyswap(t, d.args("cancel", ix.email)...)
			r.wantCode(t, exitNoRun)
			if want := "keyswap: " + ix.email + ": no rebuild in progress\n"; r.stderr != want || r.stdout != "" {
				t.Errorf("second cancel: got stdout %q, stderr %q; want stderr %q", r.stdout, r.stderr, want)
			}
		})
	}
}

// TestThrottle changes a run's limit from the CLI: the heartbeats apply
// each request (the record's limit), 0 goes back to the run's own
// MaxRate, and a high limit lets it finish; the run publishes exactly what
// its source yielded.
func TestThrottle(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ix := newIndex(testPrefix(t, d))
			src := newEndless()
			run := startRun(t, ix.rebuilder(t, d, krebuild.Options{MaxRate: 20}), src.source)
			ix.waitRecord(t, d, "the run's own limit", func(rec map[string]string) bool { return rec["limit"] == "20" })
			token := ix.token(t, d)

			// -json: the request, the run and the server, in one object.
			r := keyswap(t, d.args("throttle", "-json", ix.email, "3.5")...)
			r.wantCode(t, exitOK)
			var got controlJSON
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("throttle -json: %v\n%s", err, r.stdout)
			}
			lock := ix.lock(d)
			want := controlJSON{Server: d.server().json(), Command: "throttle", LockKey: &lock, TokenPrefix: token[:8],
				Field: "max_rate", Value: "3.5", Recorded: true}
			if !reflect.DeepEqual(got, want) || r.stderr != "" {
				w, _ := json.Marshal(want)
				t.Errorf("throttle -json: got\n%s\nstderr %q\nwant\n%s", r.stdout, r.stderr, w)
			}
			ix.waitRecord(t, d, "limit 3.5", func(rec map[string]string) bool { return rec["limit"] == "3.5" })

			for _, step := range []struct {
				rate, limit, request, done string
			}{
				{"2.5", "2.5", "2.5", "from its next heartbeat it pulls at most 2.5 items/s"},
				{"0", "20", "", "from its next heartbeat it runs at its own limit (Options.MaxRate), if any"},
				{"100000", "100000", "100000", "from its next heartbeat it pulls at most 100000 items/s"},
			} {
				r := keyswap(t, d.args("throttle", ix.email, step.rate)...)
				r.wantCode(t, exitOK)
				if want := "throttle requested for the " + ix.describeRun(token) + "; " + step.done + "\n"; r.stdout != want {
					t.Errorf("throttle %s: got stdout %q, want %q", step.rate, r.stdout, want)
				}
				rec := ix.waitRecord(t, d, "limit "+step.limit, func(rec map[string]string) bool { return rec["limit"] == step.limit })
				// C74: the request is in the run's requests, for its token;
				// the record is the run's alone.
				if ctl := ix.ctl(t, d); ctl["max_rate"] != step.request || ctl["token"] != token {
					t.Errorf("throttle %s: the requests are %q, want max_rate %q for the token %s", step.rate, ctl, step.request, token)
				}
				if _, ok := rec["max_rate"]; ok {
					t.Errorf("throttle %s: the record has max_rate %q: written into the run's record", step.rate, rec["max_rate"])
				}
			}
			// Unthrottled, the run pulls far more than 20 items/s: 500 more
			// items within the deadline.
			start := atoi(ix.record(t, d)["items"])
			ix.waitRecord(t, d, "500 more items", func(rec map[string]string) bool { return atoi(rec["items"]) >= start+500 })
			src.finish()
			if _, err := run.wait(t); err != nil {
				t.Fatalf("Run: %v", err)
			}
			ix.wantLive(t, d, people(0, src.n()))
			ix.wantNoLeftovers(t, d)
		})
	}
}

// TestPauseResume pauses a run from the CLI: its items stop advancing over
// several heartbeats, and so does its source; resumed, it goes on, and
// publishes exactly what the source yielded.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ix := newIndex(testPrefix(t, d))
			src := newEndless()
			run := startRun(t, ix.rebuilder(t, d, krebuild.Options{MaxRate: 200}), src.source)
			ix.waitRecord(t, d, "items pulled", func(rec map[string]string) bool { return atoi(rec["items"]) > 0 })
			token := ix.token(t, d)

			r := keyswap(t, d.args("pause", ix.email)...)
			r.wantCode(t, exitOK)
			if want := "pause requested for the " + ix.describeRun(token) + "; from its next heartbeat it pulls no more items, and keeps its lease, until 'keyswap resume'\n"; r.stdout != want {
				t.Errorf("pause: got stdout %q, want %q", r.stdout, want)
			}
			// The first heartbeat after the request reads it and pauses the
			// run, after it wrote items as it found them. From the second on,
			// three heartbeats see the same items, and the source yields
			// nothing more (one item waits at the gate, not counted).
			first := ix.beats(t, d, 2)[1]
			yielded := src.n()
			for i, rec := range ix.beats(t, d, 3) {
				if rec["items"] != first["items"] {
					t.Errorf("heartbeat %d while paused: items %s, want %s", i+1, rec["items"], first["items"])
				}
			}
			if n := src.n(); n != yielded || n != int(atoi(first["items"]))+1 {
				t.Errorf("while paused the source yielded %d then %d items; want %d, the items pulled plus the one at the gate", yielded, n, atoi(first["items"])+1)
			}

			r = keyswap(t, d.args("resume", ix.country)...)
			r.wantCode(t, exitOK)
			if want := "resume requested for the " + ix.describeRun(token) + "; from its next heartbeat it pulls items again\n"; r.stdout != want {
				t.Errorf("resume: got stdout %q, want %q", r.stdout, want)
			}
			paused := atoi(first["items"])
			rec := ix.waitRecord(t, d, "items after the resume", func(rec map[string]string) bool { return atoi(rec["items"]) > paused+10 })
			if rec["paused"] != "" {
				t.Errorf("after resume: paused %q, want none", rec["paused"])
			}
			src.finish()
			if _, err := run.wait(t); err != nil {
				t.Fatalf("Run: %v", err)
			}
			ix.wantLive(t, d, people(0, src.n()))
			ix.wantNoLeftovers(t, d)
		})
	}
}

// TestControlNoRun: every control command exits 4 with the same message
// when no run holds the key's lock, and when a store.WithRebuild lock
// does (it keeps no record, so takes no requests); it changes nothing.
func TestControlNoRun(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			p := testPrefix(t, d)
			rb := startRebuild(t, d.client, p+"store", store.Options{}, true)
			before := redisState(t, d, p)
			for _, cmd := range []struct {
				name  string
				extra []string
			}{{"cancel", nil}, {"throttle", []string{"10"}}, {"pause", nil}, {"resume", nil}, {"diff", nil}, {"publish", nil}, {"discard", nil}} {
				for _, tc := range []struct{ key, want string }{
					{p + "nothing", "keyswap: " + p + "nothing: no rebuild in progress\n"},
					{rb.final, "keyswap: " + rb.final + ": no rebuild in progress: the lock is held, but not by a run that keeps a record (a store lock, or a run ending)\n"},
				} {
					r := keyswap(t, d.args(cmd.name, append([]string{tc.key}, cmd.extra...)...)...)
					r.wantCode(t, exitNoRun)
					if r.stderr != tc.want || r.stdout != "" {
						t.Errorf("keyswap %s %s: got stdout %q, stderr %q; want stderr %q", cmd.name, tc.key, r.stdout, r.stderr, tc.want)
					}
				}
			}
			if after := redisState(t, d, p); !maps.Equal(after, before) {
				t.Errorf("keys changed:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

// redisState returns the DUMP of every key containing p.
func redisState(t *testing.T, d deployment, p string) map[string]string {
	t.Helper()
	out := map[string]string{}
	ctx := t.Context()
	for page, err := range scan.Pages(ctx, d.client, scan.Options{Match: "*" + scan.EscapeGlob(p) + "*"}) {
		if err != nil {
			t.Fatalf("SCAN for %s: %v", p, err)
		}
		for _, k := range page {
			if v, err := d.client.Do(ctx, d.client.B().Dump().Key(k).Build()).ToString(); err == nil {
				out[k] = v
			}
		}
	}
	return out
}
