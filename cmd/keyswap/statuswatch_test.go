package main

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
	krebuild "github.com/keyswap/keyswap/rebuild"
)

// frameWriter is a stdout that hands each Write (status --watch writes a
// snapshot at once) to frame, in the CLI's goroutine.
type frameWriter struct{ frame func(string) }

func (w frameWriter) Write(p []byte) (int, error) {
	w.frame(string(p))
	return len(p), nil
}

// watch runs 'status --watch' with args in-process, stdout a terminal or
// not, handing each snapshot written to frame, which returns false to stop
// the watch as an interrupt would. It returns the exit status and stderr.
// The watch gets a minute.
func watch(t *testing.T, terminal bool, frame func(n int, out string) bool, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var stderr strings.Builder
	n := 0
	c := &cli{
		stdin: strings.NewReader(""),
		stdout: frameWriter{func(s string) {
			n++
			if !frame(n, s) {
				cancel()
			}
		}},
		stderr: &stderr,
		now:    time.Now,
		getenv: func(string) string { return "" },
		isTerminal: func(io.Writer) bool {
			return terminal
		},
	}
	code := c.main(ctx, append([]string{"status", "--watch"}, args...))
	if ctx.Err() == context.DeadlineExceeded {
		t.Fatalf("the watch ran a minute without being stopped (%d snapshots)", n)
	}
	return code, stderr.String()
}

// jsonFrame decodes a snapshot of 'status --watch -json': one object on
// one line.
func jsonFrame(t *testing.T, out string) statusJSON {
	t.Helper()
	if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
		t.Fatalf("a snapshot of --watch -json: got %q, want one line", out)
	}
	return decodeStatusJSON(t, out)
}

// TestStatusWatch watches a run building from an endless source, as an
// operator would after a throttle: with -json, one object per line, the
// current rate falls to the limit within a few snapshots while the
// average stays far above it; as tables on a terminal, each snapshot
// clears the screen and starts with its header; on a pipe, snapshots follow
// each other. Stopped as by Ctrl-C, the watch exits 0.
func TestStatusWatch(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ix := newIndex(testPrefix(t, d))
			src := newEndless()
			run := startRun(t, ix.rebuilder(t, d, krebuild.Options{}), src.source)
			ix.waitRecord(t, d, "3000 items", func(rec map[string]string) bool { return atoi(rec["items"]) >= 3000 && rec["rate_now"] != "" })

			var last time.Time
			var throttled *runJSON
			code, stderr := watch(t, false, func(n int, out string) bool {
				doc := jsonFrame(t, out)
				if doc.Time.Before(last) || len(doc.Runs) != 1 || doc.Runs[0].RateNow == nil || doc.Key == nil || *doc.Key != ix.email {
					t.Fatalf("snapshot %d: time %v (last %v), key %v, runs %+v: want one run with a current rate", n, doc.Time, last, doc.Key, doc.Runs)
				}
				last = doc.Time
				if n == 1 {
					keyswap(t, d.args("throttle", ix.email, "50")...).wantCode(t, exitOK)
					return true
				}
				if r := doc.Runs[0]; r.Limit == 50 && *r.RateNow <= 60 {
					throttled = &r
					return false
				}
				return true
			}, append(d.redis, "-json", "--interval", "200ms", ix.email)...)
			if code != exitOK || stderr != "" {
				t.Errorf("--watch -json: exit status %d, stderr %q; want 0 and nothing", code, stderr)
			}
			if throttled == nil {
				t.Fatal("no snapshot showed the run throttled")
			}
			if now := *throttled.RateNow; now <= 0 || throttled.Rate <= 2*now {
				t.Errorf("throttled to 50/s: rate_now %v, rate %v; want a positive current rate, and the average well above it", now, throttled.Rate)
			}

			header := "Every 200ms: keyswap status --index " + shellQuote(ix.email) + ", until interrupted. "
			code, _ = watch(t, true, func(n int, out string) bool {
				rest, ok := strings.CutPrefix(out, clearScreen+header)
				if !ok || !strings.Contains(rest, "\nRUNS\n") || !strings.Contains(rest, "\nINDEXES\n") {
					t.Errorf("snapshot %d on a terminal: got\n%q\nwant it to clear the screen, start with %q and show the run and its index", n, out, header)
				}
				return n < 2
			}, append(d.redis, "--interval", "200ms", "--index", ix.email)...)
			if code != exitOK {
				t.Errorf("--watch on a terminal: exit status %d, want 0", code)
			}

			header = "Every 200ms: keyswap status " + shellQuote(ix.tag+"*") + ", until interrupted. "
			code, _ = watch(t, false, func(n int, out string) bool {
				if n > 1 {
					out = strings.TrimPrefix(out, "\n")
				}
				if !strings.HasPrefix(out, header) || strings.Contains(out, clearScreen) || !strings.Contains(out, "rebuilds in progress;") {
					t.Errorf("snapshot %d on a pipe: got\n%q\nwant it to start with %q (after a blank line but the first), without clearing", n, out, header)
				}
				return n < 2
			}, append(d.redis, "--interval", "200ms", ix.tag+"*")...)
			if code != exitOK {
				t.Errorf("--watch on a pipe: exit status %d, want 0", code)
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

// TestStatusWatchErrors: on a server of the test's own, killed while
// --watch -json watches it, then paused (SIGSTOP: it takes connections and
// answers nothing), a snapshot is an error object with its time, within
// the snapshot's time limit (5 s at 100ms), and the watch goes on, and
// shows the server again once it is back. An error of the first snapshot
// (a user that may not SCAN) ends the watch with exit status 1.
func TestStatusWatchErrors(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t)
	// The steps: each snapshot that shows the server (ok) or an error
	// moves to the next step, after acting on the server.
	steps := []struct {
		ok      bool
		errText string
		act     func() error
	}{
		{ok: true, act: srv.Kill},
		{errText: "dial tcp", act: srv.Restart},
		{ok: true, act: srv.Pause},
		{errText: "no snapshot within 5s", act: srv.Resume},
		{ok: true},
	}
	step := 0
	code, _ := watch(t, false, func(n int, out string) bool {
		var e errorJSON
		failed := json.Unmarshal([]byte(out), &e) == nil && e.Error != ""
		s := steps[step]
		switch {
		case s.ok && failed:
			return true // the client has not reconnected yet
		case s.ok:
			if doc := jsonFrame(t, out); doc.Key == nil || *doc.Key != "watched" {
				t.Fatalf("snapshot %d, step %d: key %v, want watched", n, step, doc.Key)
			}
		case !failed || e.Time == nil || e.ExitStatus != exitError || e.Command != "status" ||
			strings.Count(out, "\n") != 1 || !strings.Contains(e.Error, s.errText):
			t.Fatalf("snapshot %d, step %d: got %q, want an error object on one line, with its time, saying %q", n, step, out, s.errText)
		}
		if s.act == nil {
			return false
		}
		if err := s.act(); err != nil {
			t.Fatal(err)
		}
		step++
		return true
	}, "-u", srv.Addr, "-json", "--interval", "100ms", "watched")
	if code != exitOK || step != len(steps)-1 {
		t.Errorf("exit status %d after step %d: want 0, after step %d", code, step, len(steps)-1)
	}

	user := aclUser(t, "pw", "~*", "&*", "+@all", "-scan")
	r := keyswapEnv(t, map[string]string{envPassword: "pw"}, "status", "--watch", "-json", "-u", "redis://"+user+"@"+env.Standalone.Addr, "*")
	r.wantCode(t, exitError)
	var e errorJSON
	if err := json.Unmarshal([]byte(r.stdout), &e); err != nil || !strings.Contains(e.Error, "scan") {
		t.Errorf("a first snapshot refused: stdout %q, want one error object naming SCAN", r.stdout)
	}
}
