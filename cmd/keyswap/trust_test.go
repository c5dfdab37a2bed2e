package main

import (
	"context"
	"encoding/json"
	"errors"
	"iter"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/internal/redistest/replication"
	krebuild "github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// rebuilderOn returns a Rebuilder of ix that sends through c.
func (ix index) rebuilderOn(t *testing.T, c rueidis.Client, opts krebuild.Options) *krebuild.Rebuilder[person] {
	t.Helper()
	return redistest.Rebuilder(t, c, opts,
		builders.Hash(ix.email, func(p person) (string, string, bool) { return p.Email, p.ID, true }),
		builders.SetIndex(ix.country, func(p person) (string, string, bool) { return p.Country, p.ID, true }))
}

// TestOddKeyNames (C79): keys whose names hold a newline and a byte that is
// not UTF-8. The run's record keeps its keys length-prefixed, so that
// 'keyswap diff' compares the right buckets, and 'keyswap publish' reports
// the outcome the run had; a record that joined them with newlines read
// one key as two, compared 0 buckets, and reported a publish as failed.
func TestOddKeyNames(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			tag := newIndex(testPrefix(t, d)).tag
			ix := index{tag: tag, email: tag + ":by\nemail\xff", country: tag + ":by\ncountry\xff"}
			ix.publish(t, d, krebuild.Options{}, diffV1)
			held := ix.startHeld(t, d, krebuild.Options{}, diffV2)

			r := keyswap(t, d.args("diff", "-json", ix.country)...)
			r.wantCode(t, exitOK)
			var got diffJSON
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatalf("%v\n%s", err, r.stdout)
			}
			if len(got.Keys) != 2 || !got.Keys[1].Family || got.Keys[1].Buckets == nil || *got.Keys[1].Buckets != 4 ||
				got.Keys[1].Added != 2 || got.Keys[1].Removed != 2 || got.Keys[0].Added != 1 || got.Keys[0].Changed != 1 {
				t.Errorf("diff: got\n%s\nwant the hash (1 added, 1 changed) and the family's 4 buckets (2 added, 2 removed)", r.stdout)
			}

			r = keyswap(t, d.args("publish", "-json", ix.email)...)
			r.wantCode(t, exitOK)
			var dec decideJSON
			if err := json.Unmarshal([]byte(r.stdout), &dec); err != nil {
				t.Fatalf("%v\n%s", err, r.stdout)
			}
			if dec.Outcome != outcomePublished || len(dec.Keys) != 2 {
				t.Errorf("publish: got\n%s\nwant outcome published, 2 keys", r.stdout)
			}
			if _, err := held.wait(t); err != nil {
				t.Fatalf("Await: %v", err)
			}
			ix.wantLive(t, d, diffV2)
			ix.wantNoLeftovers(t, d)
		})
	}
}

// TestCancelWhileWaitingForDurability (C78): a run with
// Options.Durability waits for its replica, whose link is stalled. It
// keeps its lease meanwhile: its status shows the phase "waiting for
// durability" and heartbeats that go on; a cancel from the CLI ends the
// wait, and the run publishes nothing, even once the replica has caught up.
// Before, the lease ended before the wait: the status showed the phase of
// the last heartbeat, and the cancel, accepted, was never read: the run
// published once the replica acknowledged.
func TestCancelWhileWaitingForDurability(t *testing.T) {
	t.Parallel()
	pair := replication.Start(t)
	c := pair.Client(t)
	d := deployment{name: "replicated", redis: []string{"-redis", "redis://" + pair.Front.Addr()}, client: c}
	ix := newIndex(testPrefix(t, d))
	v1 := people(0, 6)
	ix.publish(t, d, krebuild.Options{}, v1)
	before := ix.liveState(t, d)

	release := make(chan struct{})
	var once sync.Once
	stall := func() { once.Do(pair.Link.Pause) }
	defer pair.Link.Resume()
	run := startRun(t, ix.rebuilder(t, d, krebuild.Options{TTL: 3 * time.Second,
		Durability: krebuild.Durability{Replicas: 1, Timeout: time.Minute}}), func(ctx context.Context) iter.Seq2[person, error] {
		return func(yield func(person, error) bool) {
			for _, p := range people(100, 9) {
				if !yield(p, nil) {
					return
				}
			}
			stall() // the replica hears nothing more
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
	})
	close(release)
	ix.waitRecord(t, d, "the durability wait", func(rec map[string]string) bool { return rec["phase"] == "waiting for durability" })
	ix.beats(t, d, 2) // the lease lives on

	r := keyswap(t, d.args("status", "-json")...)
	if !strings.Contains(r.stdout, `"phase": "waiting for durability"`) {
		t.Errorf("status: got\n%s\nwant the phase waiting for durability", r.stdout)
	}
	r = keyswap(t, d.args("cancel", ix.email)...)
	r.wantCode(t, exitOK)
	_, err := run.wait(t)
	if !errors.Is(err, krebuild.ErrAborted) {
		t.Fatalf("Run: got %v, want ErrAborted", err)
	}
	pair.Link.Resume()
	ix.wantLiveState(t, d, before)
	ix.wantLive(t, d, v1)
	ix.wantNoLeftovers(t, d)
}

// TestTooLate (C78): once a run has published, and before it releases its
// locks, a request for it is refused: 'keyswap cancel' says it is too late
// and exits 8, and nothing is recorded; the run succeeds. Before, the
// cancel was recorded, and reported as "publishes nothing".
func TestTooLate(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t) {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ix := newIndex(testPrefix(t, d))
			published, release := make(chan struct{}), make(chan struct{})
			publish := redistest.ScriptNamed("publish")
			var once sync.Once
			hooked := rueidishook.WithHook(d.client, redistest.Hook{
				OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
					is := publish.Is(cmd.Commands())
					res := c.Do(ctx, cmd)
					if is && res.Error() == nil { // not a NOSCRIPT: rueidis then sends EVAL

						// The publish ran; the release waits.
						once.Do(func() { close(published) })
						<-release
					}
					return res
				},
			})
			run := startRun(t, ix.rebuilderOn(t, hooked, krebuild.Options{}), sources.Slice(people(0, 5)))
			var released sync.Once
			let := func() { released.Do(func() { close(release) }) }
			t.Cleanup(let) // before startRun's, which waits for the run
			<-published
			token := ix.token(t, d)
			r := keyswap(t, d.args("cancel", ix.email)...)
			r.wantCode(t, exitTooLate)
			if want := "keyswap: cancel " + ix.email + ": too late: the run already published, nothing recorded: the " + ix.describeRun(token) + " publishes what it built\n"; r.stderr != want {
				t.Errorf("cancel: got stderr %q, want %q", r.stderr, want)
			}
			if ctl := ix.ctl(t, d); len(ctl) != 0 {
				t.Errorf("the requests after a refused cancel: %q, want none", ctl)
			}
			let()
			if _, err := run.wait(t); err != nil {
				t.Fatalf("Run: %v", err)
			}
			ix.wantLive(t, d, people(0, 5))
			ix.wantNoLeftovers(t, d)
		})
	}
}
