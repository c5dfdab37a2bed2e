package main

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/keys"
	krun "github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/sources"
	// krebuild, as the tests have a type named rebuild.
	krebuild "github.com/keyswap/keyswap/rebuild"
)

// The tests of the commands that act on runs start real rebuilds in the
// test process, with rebuild.New, and run the CLI against them.

// person is the item of the tests' rebuilds.
type person struct{ ID, Email, Country string }

// people returns n people from index from: ids "p<i>", emails
// "p<i>@example.com", countries cycling over fr, de, us.
func people(from, n int) []person {
	out := make([]person, n)
	for i := range out {
		j := from + i
		out[i] = person{ID: fmt.Sprint("p", j), Email: fmt.Sprintf("p%d@example.com", j), Country: []string{"fr", "de", "us"}[j%3]}
	}
	return out
}

// index is the shape of the tests' rebuilds: a hash of emails to ids, and
// a SetIndex family of ids by country, in one hash slot (a hash tag) so
// that one Rebuilder builds both on a cluster too.
type index struct {
	tag, email, country string
}

// newIndex returns the index under the test prefix p.
func newIndex(p string) index {
	tag := "{" + p + "}"
	return index{tag: tag, email: tag + ":by-email", country: tag + ":by-country"}
}

// rebuilder returns a Rebuilder of ix on d.
func (ix index) rebuilder(t *testing.T, d deployment, opts krebuild.Options) *krebuild.Rebuilder[person] {
	t.Helper()
	return redistest.Rebuilder(t, d.client, opts,
		builders.Hash(ix.email, func(p person) (string, string, bool) { return p.Email, p.ID, true }),
		builders.SetIndex(ix.country, func(p person) (string, string, bool) { return p.Country, p.ID, true }))
}

// publish rebuilds ix from ps and publishes it, failing the test on error.
func (ix index) publish(t *testing.T, d deployment, opts krebuild.Options, ps []person) krebuild.Stats {
	t.Helper()
	stats, err := ix.rebuilder(t, d, opts).Run(t.Context(), sources.Slice(ps))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return stats
}

// wantLive fails the test unless the live keys of ix are exactly those
// built from ps: the hash, and one set per country, no other bucket.
func (ix index) wantLive(t *testing.T, d deployment, ps []person) {
	t.Helper()
	hash := map[string]string{}
	sets := map[string][]string{}
	for _, p := range ps {
		hash[p.Email] = p.ID
		b := ix.country + ":" + p.Country
		sets[b] = append(sets[b], p.ID)
	}
	redistest.WantHash(t, d.client, ix.email, hash)
	buckets := redistest.LiveKeys(t, d.client, ix.country+":")
	if want := slices.Sorted(maps.Keys(sets)); !slices.Equal(buckets, want) {
		t.Errorf("buckets of %s: got %q, want %q", ix.country, buckets, want)
	}
	for b, ids := range sets {
		slices.Sort(ids)
		if got := redistest.SMembers(t, d.client, b); !slices.Equal(got, ids) {
			t.Errorf("%s: got %d members %q, want %d %q", b, len(got), got, len(ids), ids)
		}
	}
}

// lock returns the lock of the run of ix: its first key's.
func (ix index) lock(d deployment) string { return keys.LockKey(ix.email, d.cluster) }

// record returns the record of the run holding ix's locks, empty if none.
func (ix index) record(t *testing.T, d deployment) map[string]string {
	t.Helper()
	return redistest.HGetAll(t, d.client, keys.RecordKey(ix.lock(d)))
}

// ctl returns the operator's requests to the run holding ix's lock, as
// HGETALL returns them.
func (ix index) ctl(t *testing.T, d deployment) map[string]string {
	t.Helper()
	return redistest.HGetAll(t, d.client, keys.CtlKey(ix.lock(d)))
}

// token returns the token of the lock of ix, "" if none holds it.
func (ix index) token(t *testing.T, d deployment) string {
	t.Helper()
	v, _ := redistest.Get(t, d.client, ix.lock(d))
	return v
}

// waitRecord polls the record of ix's run until cond holds, and returns
// it. It fails the test after 30 seconds.
func (ix index) waitRecord(t *testing.T, d deployment, what string, cond func(rec map[string]string) bool) map[string]string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		rec := ix.record(t, d)
		if cond(rec) {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting 30s for %s: the record is %v", what, rec)
		}
		<-tick.C
	}
}

// beats waits for n heartbeats of ix's run after the call (each writes its
// time, beat_at, into the record) and returns the record as each left it.
func (ix index) beats(t *testing.T, d deployment, n int) []map[string]string {
	t.Helper()
	last := ix.record(t, d)["beat_at"]
	var out []map[string]string
	ix.waitRecord(t, d, fmt.Sprintf("%d heartbeats", n), func(rec map[string]string) bool {
		if b := rec["beat_at"]; b != "" && b != last {
			last = b
			out = append(out, rec)
		}
		return len(out) >= n
	})
	return out
}

// endless is a source of people that yields them one after the other
// until stop is closed (or the run ends).
type endless struct {
	yielded atomic.Int64
	stop    chan struct{}
}

func newEndless() *endless { return &endless{stop: make(chan struct{})} }

// source is e as a sources.Source.
func (e *endless) source(ctx context.Context) iter.Seq2[person, error] {
	return func(yield func(person, error) bool) {
		for i := 0; ; i++ {
			select {
			case <-e.stop:
				return
			case <-ctx.Done():
				return
			default:
			}
			e.yielded.Add(1)
			if !yield(people(i, 1)[0], nil) {
				return
			}
		}
	}
}

// finish stops e. Once the run has ended, people(0, e.n()) is what it
// yielded.
func (e *endless) finish() { close(e.stop) }

// n returns the number of people e yielded.
func (e *endless) n() int { return int(e.yielded.Load()) }

// gated is a source that yields first, then waits for release (or the end
// of the run) before it ends.
func gated(first []person, release <-chan struct{}) sources.Source[person] {
	return func(ctx context.Context) iter.Seq2[person, error] {
		return func(yield func(person, error) bool) {
			for _, p := range first {
				if !yield(p, nil) {
					return
				}
			}
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
	}
}

// bgRun is a Run in a goroutine of the test.
type bgRun struct {
	done  chan struct{}
	stats krebuild.Stats
	err   error
}

// startRun runs r with src in a goroutine until it ends; the test waits
// for it at cleanup, whatever happens.
func startRun(t *testing.T, r *krebuild.Rebuilder[person], src sources.Source[person]) *bgRun {
	t.Helper()
	b := &bgRun{done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background()) // not t.Context(): it ends before cleanup
	go func() {
		defer close(b.done)
		b.stats, b.err = r.Run(ctx, src)
	}()
	t.Cleanup(func() {
		cancel()
		<-b.done
	})
	return b
}

// wait waits up to a minute for the run to end, and returns its result.
func (b *bgRun) wait(t *testing.T) (krebuild.Stats, error) {
	t.Helper()
	select {
	case <-b.done:
		return b.stats, b.err
	case <-time.After(time.Minute):
		t.Fatal("the run did not end within a minute")
		return krebuild.Stats{}, nil
	}
}

// bgHeld is a run held by Build, whose Await waits in a goroutine.
type bgHeld struct {
	held  *krebuild.Held[person]
	done  chan struct{}
	stats krebuild.Stats
	err   error
}

// startHeld builds ix from ps with Build, waits until the run's record says
// it is held (its first heartbeat since), and starts Await in a goroutine.
// The run is discarded at cleanup if the test did not end it.
func (ix index) startHeld(t *testing.T, d deployment, opts krebuild.Options, ps []person) *bgHeld {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	held, _, err := ix.rebuilder(t, d, opts).Build(ctx, sources.Slice(ps))
	if err != nil {
		cancel()
		t.Fatalf("Build: %v", err)
	}
	h := &bgHeld{held: held, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		h.stats, h.err = held.Await(context.Background())
	}()
	t.Cleanup(func() {
		cancel()
		<-h.done
	})
	ix.waitRecord(t, d, "the held phase", func(rec map[string]string) bool { return rec["phase"] == "held" })
	return h
}

// wait waits up to a minute for Await to return, and returns its result.
func (h *bgHeld) wait(t *testing.T) (krebuild.Stats, error) {
	t.Helper()
	select {
	case <-h.done:
		return h.stats, h.err
	case <-time.After(time.Minute):
		t.Fatal("the held run did not end within a minute")
		return krebuild.Stats{}, nil
	}
}

// describeRun is how the commands name the run of ix holding token.
func (ix index) describeRun(token string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("rebuild of %s, %s (host %s, pid %d, token %s)", ix.email, ix.country, host, os.Getpid(), token[:8])
}

// wantNoLeftovers fails the test if a lock, record, log or temp key of
// ix's is left.
func (ix index) wantNoLeftovers(t *testing.T, d deployment) {
	t.Helper()
	redistest.WantClean(t, d.client, ix.tag)
}

// liveState returns the DUMP of every key under ix's tag but the run's own
// (temp keys, locks, records, logs): the live keys, metas and kept
// previous values, to compare before and after something that must not
// change them. TTLs are left out: they tick.
func (ix index) liveState(t *testing.T, d deployment) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, s := range redistest.Snapshot(t, d.client, ix.tag) {
		if _, _, temp := keys.ParseTempKey(k); temp || strings.Contains(k, keys.LockSuffix) {
			continue
		}
		out[k] = s.Dump
	}
	return out
}

// wantLiveState fails the test unless liveState is before.
func (ix index) wantLiveState(t *testing.T, d deployment, before map[string]string) {
	t.Helper()
	if after := ix.liveState(t, d); !maps.Equal(after, before) {
		t.Errorf("keys changed: got %d keys %q, want %d %q", len(after), slices.Sorted(maps.Keys(after)), len(before), slices.Sorted(maps.Keys(before)))
	}
}

func TestParseRecord(t *testing.T) {
	// A record of this keyswap (v 2): its keys length-prefixed, so that a
	// newline or a byte that is not UTF-8 survives (C79); the requests come
	// from the hash next to it, and count only with the run's token.
	ctl := map[string]string{"token": "0123456789abcdef", "cancel": "", "max_rate": "50", "paused": "1", "action": "publish"}
	rec, err := parseRecord("a:rebuild-lock", map[string]string{
		"v": "2", "token": "0123456789abcdef", "mode": "rebuild", "keys": krun.EncodeKeys([]string{"a\nb", "{b}:\xff"}), "families": "01", "suffix": ":rebuild:1:00",
		"host": "h", "pid": "42", "started": "1700000000123", "ttl": "300", "expected": "10", "phase": "building",
		"items": "5", "entries": "7", "acked": "1", "rate": "2.5", "limit": "0", "latency_us": "1500", "eta": "2",
		"beat_at": "1700000001000", "progress_at": "", "changes": "3", "replayed": "1",
	}, ctl)
	eta := int64(2)
	want := runRecord{
		Lock: "a:rebuild-lock", Token: "0123456789abcdef", Keys: []string{"a\nb", "{b}:\xff"}, Families: []bool{false, true},
		Suffix: ":rebuild:1:00", Host: "h", PID: 42, Started: time.UnixMilli(1700000000123).UTC(), LeaseSeconds: 300,
		Expected: 10, Phase: "building", Items: 5, Entries: 7, Acked: 1, Rate: 2.5, Latency: 1500 * time.Microsecond, ETASeconds: &eta,
		BeatAt: time.UnixMilli(1700000001000).UTC(), Changes: 3, Replayed: 1,
		Requests: runRequests{MaxRate: 50, Paused: true, Action: "publish"},
	}
	if err != nil || !reflect.DeepEqual(rec, want) {
		t.Errorf("got\n%+v, %v\nwant\n%+v", rec, err, want)
	}

	// Requests written for another run are not this one's.
	ctl["token"] = "fedcba9876543210"
	if rec, _ := parseRecord("a:rebuild-lock", map[string]string{"v": "2", "token": "0123456789abcdef"}, ctl); rec.Requests != (runRequests{}) {
		t.Errorf("another run's requests: got %+v, want none", rec.Requests)
	}

	// A record of an older keyswap (no version): its keys joined by "\n".
	rec, err = parseRecord("a:rebuild-lock", map[string]string{"token": "t", "keys": "a\n{b}:c", "families": "01", "phase": "held"}, nil)
	if err != nil || !slices.Equal(rec.Keys, []string{"a", "{b}:c"}) || !slices.Equal(rec.Families, []bool{false, true}) || rec.Phase != "held" {
		t.Errorf("a v1 record: got %+v, %v; want its two keys, held", rec, err)
	}

	// A record of a newer keyswap: its version shown, nothing misread.
	rec, err = parseRecord("a:rebuild-lock", map[string]string{"v": "3", "token": "t", "keys": "a", "phase": "building"}, nil)
	if !errors.Is(err, krun.ErrRecordVersion) || rec.Keys != nil || rec.Phase != `unknown record version "3": upgrade keyswap` {
		t.Errorf("a v3 record: got %+v, %v; want the version in the phase, no keys, ErrRecordVersion", rec, err)
	}

	// A field that is not as keyswap writes it is named.
	if _, err := parseRecord("a:rebuild-lock", map[string]string{"v": "2", "token": "t", "pid": "x"}, nil); err == nil || !strings.Contains(err.Error(), `"pid"`) {
		t.Errorf("a bad pid: got %v, want an error naming the field", err)
	}
}
