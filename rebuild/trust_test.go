package rebuild_test

// Online rebuilds against writers, operators and evictions that break the
// contract: a hostile writer of a run's log, a log lost on its own, a
// forged record, a change applied while a run that does not log holds the
// lock, entries two items share, and a publish asked to replay too much.
// Each test makes the failure happen on a real server and checks that the
// run fails closed (or, where it can, stays exact): nothing published that
// should not be, the live keys holding every change, nothing left.

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// standalone returns the standalone deployment of the package's servers.
func standalone(t *testing.T) deployment {
	t.Helper()
	for _, d := range env.Deployments(t) {
		if !d.Cluster {
			return d
		}
	}
	t.Fatal("no standalone deployment")
	return deployment{}
}

// onPublish returns c with a hook that calls before(n) before the n-th
// publish script (1, 2, ...) is sent.
func onPublish(c rueidis.Client, before func(n int)) rueidis.Client {
	publish := redistest.ScriptNamed("publish")
	var n atomic.Int64
	return rueidishook.WithHook(c, redistest.Hook{
		OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			if args := cmd.Commands(); publish.Is(args) && args[0] == "EVALSHA" {
				before(int(n.Add(1)))
			}
			return c.Do(ctx, cmd)
		},
	})
}

// logOf returns the log of changes of the run holding live's lock.
func logOf(d deployment, live string) string { return keys.LogKey(keys.LockKey(live, d.Cluster)) }

// recordOf returns the record of the run holding live's lock.
func recordOf(d deployment, live string) string {
	return keys.RecordKey(keys.LockKey(live, d.Cluster))
}

// entry returns a log entry of one op, as the apply script writes it.
func entry(cmd, key string, args ...string) string {
	put := func(s string) string { return strconv.Itoa(len(s)) + ":" + s }
	e := put(cmd) + put(key) + put(strconv.Itoa(len(args)))
	for _, a := range args {
		e += put(a)
	}
	return e
}

func TestTrustTailInjection(t *testing.T) {
	// C72: a Redis user with exactly the rights Apply needs (RPUSH on a
	// run's log among them) appends to the hash's log 1,000 entries that
	// are valid changes of the run's keys, which the catch-up replays, and,
	// just before the publish is sent, one crafted "SADD admins mallory":
	// a key the run does not rebuild, which the publish script would run
	// with the rebuild's rights. Either with the counters advanced as Apply
	// advances them, or without, the run fails closed with ErrTampered,
	// naming the log; admins is untouched, the live keys are as they were,
	// and nothing is left. (On a cluster the foreign key fails by its slot
	// already; the test runs on the standalone server.)
	d := standalone(t)
	for _, counted := range []bool{true, false} {
		t.Run(fmt.Sprintf("counted=%v", counted), func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t)
			d := casePrefixed(d, fmt.Sprint(counted))
			ix := &indexOf{k: onlineNames(d.Prefix)}
			onlineSeed(t, d, ix.k, 300, 5)
			admins := d.Prefix + "admins"
			redistest.Cmd(t, d.Other, "SADD", admins, "alice")
			before := redistest.Snapshot(t, d.Other, d.Prefix)
			attacker := env.Standalone.ClientAs(t, "ks-apply-"+strconv.FormatBool(counted)+"-"+strconv.FormatInt(time.Now().UnixNano(), 36), redistest.ApplyRules(d.Prefix+"idx:*")...)
			log, rec := logOf(d, ix.k.Hash), recordOf(d, ix.k.Hash)
			push := func(e string) error {
				if err := attacker.Do(ctx, attacker.B().Rpush().Key(log).Element(e).Build()).Error(); err != nil {
					return fmt.Errorf("RPUSH: %w", err)
				}
				if !counted {
					return nil
				}
				for _, field := range []string{"logged", "work"} {
					if err := attacker.Do(ctx, attacker.B().Hincrby().Key(rec).Field(field).Increment(1).Build()).Error(); err != nil {
						return fmt.Errorf("HINCRBY %s: %w", field, err)
					}
				}
				return nil
			}
			c := onPublish(d.Client, func(n int) {
				if n == 1 {
					if err := push(entry("SADD", admins, "mallory")); err != nil {
						t.Errorf("the crafted entry: %v", err)
					}
				}
			})
			h := startHeld(t, ctx, onlineRebuilder(t, c, ix.k, rebuild.Options{}), d.Client, ix.k.DB)
			for i := range 1000 {
				if err := push(entry("HSET", ix.k.Hash, fmt.Sprintf("fake%04d@example.com", i), "u999999")); err != nil {
					t.Fatal(err)
				}
			}
			_, err := h.wait()
			redistest.WantErr(t, err, rebuild.ErrTampered)
			if !strings.Contains(err.Error(), log) {
				t.Errorf("Run: %v, want it to name %s", err, log)
			}
			t.Logf("Run: %v", err)
			if got := redistest.SMembers(t, d.Other, admins); !slices.Equal(got, []string{"alice"}) {
				t.Errorf("%s = %q, want only alice", admins, got)
			}
			redistest.WantUnchanged(t, d.Other, d.Prefix, before)
			redistest.WantClean(t, d.Other, d.Prefix)
		})
	}
}

func TestTrustForeignEntryNamed(t *testing.T) {
	// C72: an entry whose key is not the run's, or whose command no builder
	// writes, fails the run closed with ErrTampered, naming the log, the
	// entry's index and the key, whether the catch-up or the publish finds
	// it; the reserved shapes under a family's prefix (its lock, record,
	// log, requests, receipt, meta, kept previous value and temp keys) are
	// not the family's. The live keys are as they were, nothing is left.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, tc := range []struct {
			name    string
			live    func(k onlineKeys) string // the builder whose log gets the entry
			key     func(k onlineKeys) string
			cmd     string
			args    []string
			publish bool // appended just before the publish, not before the catch-up
		}{
			{"another builder's key", func(k onlineKeys) string { return k.Hash }, func(k onlineKeys) string { return k.Zset }, "ZADD", []string{"1", "m"}, false},
			{"a key outside the run", func(k onlineKeys) string { return k.Hash }, func(k onlineKeys) string { return k.Hash + "x" }, "HSET", []string{"f", "v"}, true},
			{"a command no builder writes", func(k onlineKeys) string { return k.Hash }, func(k onlineKeys) string { return k.Hash }, "DEL", nil, true},
			{"the family's lock", func(k onlineKeys) string { return k.Family }, func(k onlineKeys) string { return k.Family + ":rebuild-lock" }, "SADD", []string{"m"}, false},
			{"the family's requests", func(k onlineKeys) string { return k.Family }, func(k onlineKeys) string { return k.Family + ":x:rebuild-lock:ctl" }, "SADD", []string{"m"}, true},
			{"the family's meta", func(k onlineKeys) string { return k.Family }, func(k onlineKeys) string { return k.Family + ":fr:rebuild-gen" }, "SADD", []string{"m"}, true},
			{"a kept previous value", func(k onlineKeys) string { return k.Family }, func(k onlineKeys) string { return k.Family + ":fr:rebuild-prev" }, "SADD", []string{"m"}, false},
			{"a temp key", func(k onlineKeys) string { return k.Family }, func(k onlineKeys) string { return k.Family + ":fr:rebuild:1700000000:0123456789abcdef" }, "SADD", []string{"m"}, true},
			{"the prefix itself", func(k onlineKeys) string { return k.Family }, func(k onlineKeys) string { return k.Family + ":" }, "SADD", []string{"m"}, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				d := casePrefixed(d, tc.name)
				ix := seedIndex(t, d, users(9)...)
				before := redistest.Snapshot(t, d.Other, d.Prefix)
				live := tc.live(ix.k)
				log, rec := logOf(d, live), recordOf(d, live)
				key := tc.key(ix.k)
				valid := entry("HSET", ix.k.Hash, "f@example.com", "u000000")
				if live == ix.k.Family {
					valid = entry("SADD", ix.k.Family+":fr", "u000000")
				}
				push := func() {
					e := entry(tc.cmd, key, tc.args...)
					if tc.cmd == "DEL" {
						e = "3:DEL" + strconv.Itoa(len(key)) + ":" + key + "1:0"
					}
					for _, cmd := range []rueidis.Completed{
						d.Other.B().Rpush().Key(log).Element(valid).Element(e).Build(),
						d.Other.B().Hincrby().Key(rec).Field("logged").Increment(2).Build(),
						d.Other.B().Hincrby().Key(rec).Field("work").Increment(4).Build(),
					} {
						if err := d.Other.Do(ctx, cmd).Error(); err != nil {
							t.Errorf("pushing the entry: %v", err)
						}
					}
				}
				c := onPublish(d.Client, func(n int) {
					if n == 1 && tc.publish {
						push()
					}
				})
				h := startHeld(t, ctx, onlineRebuilder(t, c, ix.k, rebuild.Options{}), d.Client, ix.k.DB)
				if !tc.publish {
					push()
				}
				_, err := h.wait()
				redistest.WantErr(t, err, rebuild.ErrTampered)
				for _, says := range []string{log, "entry 1", strconv.Quote(key)} {
					if tc.cmd == "DEL" && says == strconv.Quote(key) {
						says = "DEL"
					}
					if !strings.Contains(err.Error(), says) {
						t.Errorf("Run: %v, want it to say %s", err, says)
					}
				}
				t.Logf("Run: %v", err)
				redistest.WantUnchanged(t, d.Other, d.Prefix, before)
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

// retryApply applies cs with r, again while it is refused with
// ErrInProgress (a run that does not log holds a lock), until ctx ends.
func retryApply(ctx context.Context, r *rebuild.Rebuilder[user], cs ...rebuild.Change[user]) error {
	for {
		err := r.Apply(ctx, cs...)
		if !errors.Is(err, rebuild.ErrInProgress) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (still refused: %w)", context.Cause(ctx), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestTrustLogDeleted(t *testing.T) {
	// C73: the log of changes is deleted while the run holds its source
	// back, after changes were logged: the run fails closed with
	// ErrWritesLost, naming the log, instead of publishing without them;
	// the live keys hold every change, and nothing is left. Deleting the
	// log before or after a catch-up is the same: the counter in the
	// record says how many entries the log must hold.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, when := range []string{"before the catch-up", "before the publish"} {
			t.Run(when, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				d := casePrefixed(d, when)
				k := onlineNames(d.Prefix)
				onlineSeed(t, d, k, 300, 3)
				app := applier{c: d.Other, r: onlineRebuilder(t, d.Other, k, rebuild.Options{}), db: k.DB}
				log := logOf(d, k.Hash)
				c := onPublish(d.Client, func(n int) {
					if n == 1 && when == "before the publish" {
						if err := app.apply(ctx, inserts(100, 5)...); err != nil {
							t.Errorf("apply: %v", err)
						}
						redistest.Cmd(t, d.Other, "DEL", log)
					}
				})
				h := startHeld(t, ctx, onlineRebuilder(t, c, k, rebuild.Options{}), d.Client, k.DB)
				if err := app.apply(ctx, inserts(0, 20)...); err != nil {
					t.Fatal(err)
				}
				if when == "before the catch-up" {
					redistest.Cmd(t, d.Other, "DEL", log)
				}
				_, err := h.wait()
				redistest.WantErr(t, err, rebuild.ErrWritesLost)
				if !strings.Contains(err.Error(), log) {
					t.Errorf("Run: %v, want it to name %s", err, log)
				}
				t.Logf("Run: %v", err)
				truth, err := redistest.ReadTruth(ctx, d.Other, k.DB)
				if err != nil {
					t.Fatal(err)
				}
				wantIndex(t, d.Other, k, truth)
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

func TestTrustRecordForged(t *testing.T) {
	// C74: a Redis user that may write a run's record overwrites its token:
	// Apply then refuses the change (ErrInProgress), where the old apply
	// script applied it without logging it and the publish reverted it;
	// the run fails closed with ErrTampered; once it has ended, the change
	// applies, and the live keys hold every change.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		k := onlineNames(d.Prefix)
		onlineSeed(t, d, k, 300, 4)
		app := applier{c: d.Other, r: onlineRebuilder(t, d.Other, k, rebuild.Options{}), db: k.DB}
		// The run's heartbeats wait for beats: the forged record must
		// still be there when Apply comes.
		beats := make(chan struct{})
		heartbeat := redistest.ScriptNamed("heartbeat")
		c := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				if heartbeat.Is(cmd.Commands()) {
					<-beats
				}
				return c.Do(ctx, cmd)
			},
		})
		h := startHeld(t, ctx, onlineRebuilder(t, c, k, rebuild.Options{}), d.Client, k.DB)
		if err := app.apply(ctx, inserts(0, 10)...); err != nil {
			t.Fatal(err)
		}
		redistest.Cmd(t, d.Other, "HSET", recordOf(d, k.Hash), "token", "forged")
		change := inserts(10, 1)[0]
		redistest.Cmd(t, d.Other, "HSET", k.DB, change.New.ID, redistest.EncodeUser(*change.New))
		before := redistest.HGetAll(t, d.Other, k.Hash)
		err := app.r.Apply(ctx, change)
		redistest.WantErr(t, err, rebuild.ErrInProgress)
		t.Logf("Apply: %v", err)
		redistest.WantHash(t, d.Other, k.Hash, before)
		close(beats)
		_, err = h.wait()
		redistest.WantErr(t, err, rebuild.ErrTampered)
		t.Logf("Run: %v", err)
		if err := retryApply(ctx, app.r, change); err != nil {
			t.Fatalf("Apply once the run ended: %v", err)
		}
		truth, err := redistest.ReadTruth(ctx, d.Other, k.DB)
		if err != nil {
			t.Fatal(err)
		}
		wantIndex(t, d.Other, k, truth)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestTrustApplyWhileUnloggedRunHoldsTheLock(t *testing.T) {
	// C75: while a lock is held by a run that does not log changes (the
	// single-key API, store.WithRebuild; a Familia rebuild, a bare SET of
	// the lock; a run whose record has a version this keyswap does not
	// know), Apply refuses a change to its keys with ErrInProgress, before
	// writing anything, saying to apply it again once that rebuild ends;
	// it never applies it silently, for that rebuild's swap to revert. Once
	// the lock is free, the change applies.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, tc := range []struct {
			name string
			says string
			// hold holds the hash's lock, calls apply, and releases it.
			hold func(t *testing.T, ctx context.Context, d deployment, k onlineKeys, apply func())
		}{
			{"store.WithRebuild", "store.WithRebuild", func(t *testing.T, ctx context.Context, d deployment, k onlineKeys, apply func()) {
				st := store.New(d.Client, store.Options{})
				err := st.WithRebuild(ctx, k.Hash, store.RebuildOptions{}, func(ctx context.Context, temp string, touch func(context.Context) error) error {
					redistest.Cmd(t, d.Client, "RENAME", k.Hash, temp) // rebuilt as it was
					apply()
					return nil
				})
				if err != nil {
					t.Fatalf("WithRebuild: %v", err)
				}
			}},
			{"a Familia lock", "Familia", func(t *testing.T, ctx context.Context, d deployment, k onlineKeys, apply func()) {
				lock := keys.LockKey(k.Hash, d.Cluster)
				redistest.Cmd(t, d.Other, "SET", lock, "ruby-token", "EX", "60")
				apply()
				redistest.Cmd(t, d.Other, "DEL", lock)
			}},
			{"a record of an unknown version", "upgrade", func(t *testing.T, ctx context.Context, d deployment, k onlineKeys, apply func()) {
				lock := keys.LockKey(k.Hash, d.Cluster)
				redistest.Cmd(t, d.Other, "SET", lock, "future-token", "EX", "60")
				redistest.Cmd(t, d.Other, "HSET", keys.RecordKey(lock), "v", "3", "token", "future-token", "mode", "rebuild")
				apply()
				redistest.Cmd(t, d.Other, "DEL", lock, keys.RecordKey(lock))
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				d := casePrefixed(d, tc.name)
				us := users(6)
				ix := seedIndex(t, d, us...)
				r := redistest.Rebuilder(t, d.Other, rebuild.Options{},
					builders.Hash(ix.k.Hash, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
				moved := with(us[1], func(u *user) { u.Email = "moved@example.com" })
				change := rebuild.Update(us[1], moved)
				tc.hold(t, ctx, d, ix.k, func() {
					before := redistest.HGetAll(t, d.Other, ix.k.Hash)
					err := r.Apply(ctx, change)
					redistest.WantErr(t, err, rebuild.ErrInProgress)
					if err != nil && (!strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "again")) {
						t.Errorf("Apply: %v, want it to say %q and to apply it again", err, tc.says)
					}
					t.Logf("Apply: %v", err)
					redistest.WantHash(t, d.Other, ix.k.Hash, before)
				})
				if err := r.Apply(ctx, change); err != nil {
					t.Fatalf("Apply once the lock is free: %v", err)
				}
				want := map[string]string{}
				for _, u := range us {
					want[u.Email] = u.ID
				}
				delete(want, us[1].Email)
				want[moved.Email] = moved.ID
				redistest.WantHash(t, d.Other, ix.k.Hash, want)
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

// person is the item of the shared-entry tests: an email (the Hash's
// field and the SortedSet's member) that moves between people.
type person struct {
	ID, Email string
	Score     float64
}

func TestTrustSharedEntries(t *testing.T) {
	// C76: person 1's email goes from x to y, then person 2 takes x, and
	// the application applies person 2's change first (the order of two
	// items' changes is not kept). The Hash's removal of x, and the
	// SortedSet's, happen only while x still holds person 1's value, so
	// person 2's entry survives: with no run in progress, and with a run
	// that replays them in its catch-up or in its publish. Applying each
	// change twice changes nothing.
	p1, p2 := person{"1", "x@example.com", 1}, person{"2", "w@example.com", 2}
	p1moved := person{"1", "y@example.com", 1}
	p2moved := person{"2", "x@example.com", 2}
	changes := []rebuild.Change[person]{rebuild.Update(p2, p2moved), rebuild.Update(p1, p1moved)}
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, when := range []string{"no run", "catch-up", "publish"} {
			t.Run(when, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				d := casePrefixed(d, when)
				hash, zset := d.Prefix+"by-email", d.Prefix+"score-by-email"
				bs := func() []rebuild.Builder[person] {
					return []rebuild.Builder[person]{
						builders.Hash(hash, func(p person) (string, string, bool) { return p.Email, p.ID, true }),
						builders.SortedSet(zset, func(p person) (string, float64, bool) { return p.Email, p.Score, true }),
					}
				}
				if _, err := redistest.Rebuilder(t, d.Client, rebuild.Options{}, bs()...).Run(ctx, rebuild.FromSlice([]person{p1, p2})); err != nil {
					t.Fatal(err)
				}
				app := redistest.Rebuilder(t, d.Other, rebuild.Options{}, bs()...)
				apply := func() {
					for range 2 {
						for _, c := range changes {
							if err := app.Apply(ctx, c); err != nil {
								t.Errorf("Apply: %v", err)
							}
						}
					}
				}
				switch when {
				case "no run":
					apply()
				default:
					c := onPublish(d.Client, func(n int) {
						if n == 1 && when == "publish" {
							apply()
						}
					})
					// The source read before the changes: the old emails.
					release := make(chan struct{})
					src := func(ctx context.Context) iter.Seq2[person, error] {
						return func(yield func(person, error) bool) {
							<-release
							for _, p := range []person{p1, p2} {
								if !yield(p, nil) {
									return
								}
							}
						}
					}
					done := make(chan error, 1)
					r := redistest.Rebuilder(t, c, rebuild.Options{}, bs()...)
					go func() { _, err := r.Run(ctx, src); done <- err }()
					waitLocked(t, d, hash)
					if when == "catch-up" {
						apply()
					}
					close(release)
					if err := <-done; err != nil {
						t.Fatalf("Run: %v", err)
					}
				}
				redistest.WantHash(t, d.Other, hash, map[string]string{"x@example.com": "2", "y@example.com": "1"})
				if got, want := redistest.ZScores(t, d.Other, zset), map[string]float64{"x@example.com": 2, "y@example.com": 1}; !maps2Equal(got, want) {
					t.Errorf("%s = %v, want %v", zset, got, want)
				}
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

// maps2Equal reports whether a and b hold the same entries.
func maps2Equal[K, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// waitLocked waits until live's lock is held.
func waitLocked(t *testing.T, d deployment, live string) {
	t.Helper()
	lock := keys.LockKey(live, d.Cluster)
	deadline := time.Now().Add(30 * time.Second)
	for !redistest.Exists(t, d.Other, lock) {
		if time.Now().After(deadline) {
			t.Fatalf("%s not held within 30s", lock)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestTrustSharedSetMembersRefused(t *testing.T) {
	// C76: a Set or SetIndex keeps a member for one item: two items that
	// share one (a Set of countries, say) would lose it when one of them
	// moves, as Apply removes it. A run whose items share a member of a
	// key fails, naming the key and, when it can, the member; the live
	// keys are as they were, and nothing is left.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		for _, tc := range []struct {
			name   string
			opts   rebuild.Options
			family bool
			member bool // the error names the member
		}{
			{"Set", rebuild.Options{}, false, true},
			{"Set, members sent apart", rebuild.Options{BatchSize: 1, MaxMerged: 1}, false, false},
			{"SetIndex", rebuild.Options{}, true, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx := redistest.Ctx(t)
				d := casePrefixed(d, tc.name)
				key := d.Prefix + "countries"
				b := builders.Set(key, func(u user) (string, bool) { return u.Country, true })
				if tc.family {
					b = builders.SetIndex(key, func(u user) (string, string, bool) { return "all", u.Country, true })
					key += ":all"
				}
				redistest.Cmd(t, d.Other, "SADD", key, "old")
				before := redistest.Snapshot(t, d.Other, d.Prefix)
				us := []user{{ID: "1", Country: "fr"}, {ID: "2", Country: "de"}, {ID: "3", Country: "fr"}}
				_, err := redistest.Rebuilder(t, d.Client, tc.opts, b).Run(ctx, rebuild.FromSlice(us))
				if err == nil {
					t.Fatal("Run: nil, want the shared member refused")
				}
				t.Logf("Run: %v", err)
				if !strings.Contains(err.Error(), strconv.Quote(key)) || !strings.Contains(err.Error(), "share") {
					t.Errorf("Run: %v, want it to name %s and say a member is shared", err, key)
				}
				if tc.member && !strings.Contains(err.Error(), `"fr"`) {
					t.Errorf("Run: %v, want it to name the member fr", err)
				}
				redistest.WantUnchanged(t, d.Other, d.Prefix, before)
				redistest.WantClean(t, d.Other, d.Prefix)
			})
		}
	})
}

func TestTrustTooManyKeysInCatchUp(t *testing.T) {
	// C62: changes applied during the run add buckets to the family past
	// Options.MaxKeys: the catch-up fails with ErrTooManyKeys, saying so,
	// and not blaming another process with another definition; nothing is
	// published, nothing left.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		k := onlineNames(d.Prefix)
		onlineSeed(t, d, k, 60, 8) // 40 buckets at most: 42 keys with the hash and the sorted set
		app := applier{c: d.Other, r: onlineRebuilder(t, d.Other, k, rebuild.Options{}), db: k.DB}
		keysBefore := 2 + len(redistest.LiveKeys(t, d.Other, k.Family+":"))
		h := startHeld(t, ctx, onlineRebuilder(t, d.Client, k, rebuild.Options{MaxKeys: keysBefore}), d.Client, k.DB)
		// Buckets the source does not have: "c00".."c06" of inserts are
		// among them only if the seed lacks them; add more to be sure.
		var cs []rebuild.Change[user]
		for i := range 5 {
			cs = append(cs, rebuild.Insert(user{ID: fmt.Sprintf("x%d", i), Email: fmt.Sprintf("x%d@example.com", i), Country: fmt.Sprintf("new%d", i), Score: 1}))
		}
		if err := app.apply(ctx, cs...); err != nil {
			t.Fatal(err)
		}
		_, err := h.wait()
		wantRunErr(t, err, "catch-up", rebuild.ErrTooManyKeys, "Options.MaxKeys")
		if strings.Contains(err.Error(), "definition") {
			t.Errorf("Run: %v, want no word of another definition", err)
		}
		truth, err := redistest.ReadTruth(ctx, d.Other, k.DB)
		if err != nil {
			t.Fatal(err)
		}
		wantIndex(t, d.Other, k, truth)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestTrustMaxHold(t *testing.T) {
	// C68: a held run that gets no decision within Options.MaxHold is
	// discarded, with an error matching ErrDiscarded that names MaxHold:
	// its locks and temp keys are gone, the live keys as they were. Diff
	// on it then says the run has ended, rather than comparing the live
	// keys with temp keys that are gone.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ix := seedIndex(t, d, users(9)...)
		before := redistest.Snapshot(t, d.Other, d.Prefix)
		r := onlineRebuilder(t, d.Client, ix.k, rebuild.Options{MaxHold: time.Second})
		held, _, err := r.Build(ctx, rebuild.FromSlice(users(12)))
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		_, err = held.Await(ctx)
		wantRunErr(t, err, "publish", rebuild.ErrDiscarded, "Options.MaxHold")
		_, err = held.Diff(ctx, rebuild.DiffOptions{})
		if err == nil || !strings.Contains(err.Error(), "has ended") {
			t.Errorf("Diff after the run ended: got %v, want an error saying it ended", err)
		}
		redistest.WantUnchanged(t, d.Other, d.Prefix, before)
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestTrustDiffAfterDiscard(t *testing.T) {
	// C68: Held.Diff on a run discarded, or published, says the run has
	// ended.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		ix := seedIndex(t, d, users(6)...)
		for _, end := range []string{"discard", "publish"} {
			r := onlineRebuilder(t, d.Client, ix.k, rebuild.Options{})
			held, _, err := r.Build(ctx, rebuild.FromSlice(users(6)))
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			if _, err := held.Diff(ctx, rebuild.DiffOptions{}); err != nil {
				t.Fatalf("Diff while held: %v", err)
			}
			if end == "discard" {
				err = held.Discard(ctx)
			} else {
				_, err = held.Publish(ctx)
			}
			if err != nil {
				t.Fatalf("%s: %v", end, err)
			}
			_, err = held.Diff(ctx, rebuild.DiffOptions{})
			if err == nil || !strings.Contains(err.Error(), "has ended") {
				t.Errorf("Diff after %s: got %v, want an error saying the run ended", end, err)
			}
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

func TestTrustRollbackMaxKeys(t *testing.T) {
	// C69: a rollback is one atomic script, as a publish is: one that
	// would swap more keys than Options.MaxKeys is refused before any
	// write, with ErrTooManyKeys; every key as it was, no lock left.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		family := d.Prefix + "tags"
		b := func() rebuild.Builder[user] {
			return builders.SetIndex(family, func(u user) (string, string, bool) { return u.Email, u.ID, true })
		}
		us := users(20) // 20 buckets
		for i := range 2 {
			if _, err := redistest.Rebuilder(t, d.Client, rebuild.Options{KeepPrevious: time.Hour}, b()).Run(ctx, rebuild.FromSlice(us[i:])); err != nil {
				t.Fatalf("run %d: %v", i, err)
			}
		}
		before := redistest.Snapshot(t, d.Other, d.Prefix)
		_, err := redistest.Rebuilder(t, d.Client, rebuild.Options{MaxKeys: 10}, b()).Rollback(ctx)
		redistest.WantErr(t, err, rebuild.ErrTooManyKeys)
		if !strings.Contains(err.Error(), "swap 20") {
			t.Errorf("Rollback: %v, want it to say it would swap 20 keys", err)
		}
		t.Logf("Rollback: %v", err)
		redistest.WantUnchanged(t, d.Other, d.Prefix, before)
		if _, err := redistest.Rebuilder(t, d.Client, rebuild.Options{}, b()).Rollback(ctx); err != nil {
			t.Errorf("Rollback within the bound: %v", err)
		}
	})
}

func TestTrustPublishWorkBound(t *testing.T) {
	// C77: just before the publish, 999 changes of 200 updates each are
	// logged: within PublishTail entries, but about 1.2 million ops and
	// arguments, which the publish script would replay while every other
	// client waits (4.1 s measured). The publish refuses them before any
	// write ({-7}), the run catches up, and the next publish replays a
	// tail within PublishTailWork. The index is exact. The publish
	// scripts' time, from the server's SLOWLOG, is logged.
	t.Parallel()
	srv := redistest.OwnServer(t, "--slowlog-log-slower-than", "1000", "--slowlog-max-len", "10000")
	c, other := srv.Client(t), srv.Client(t)
	// 200,000 updates to catch up with: minutes under -race on a loaded
	// machine, which the test is not about.
	ctx := slowCtx(t)
	key := redistest.Prefix(t) + "by-email"
	hash := func() rebuild.Builder[user] {
		return builders.Hash(key, func(u user) (string, string, bool) { return u.Email, u.ID, true })
	}
	us := users(200)
	if _, err := redistest.Rebuilder(t, c, rebuild.Options{}, hash()).Run(ctx, rebuild.FromSlice(us)); err != nil {
		t.Fatal(err)
	}
	app := redistest.Rebuilder(t, other, rebuild.Options{}, hash())
	publish := redistest.ScriptNamed("publish")
	var codes []int64
	hooked := rueidishook.WithHook(c, redistest.Hook{
		OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			is := publish.Is(cmd.Commands()) && cmd.Commands()[0] == "EVALSHA"
			if is && len(codes) == 0 {
				for round := range 999 {
					cs := make([]rebuild.Change[user], len(us))
					for i, u := range us {
						next := u
						next.Email = fmt.Sprintf("u%06d.%d@example.com", i, round)
						cs[i], us[i] = rebuild.Update(u, next), next
					}
					if err := app.Apply(ctx, cs...); err != nil {
						t.Errorf("Apply: %v", err)
						break
					}
				}
			}
			res := c.Do(ctx, cmd)
			if code, ok := publishCode(res); is && ok {
				codes = append(codes, code)
			}
			return res
		},
	})
	stats, err := redistest.Rebuilder(t, hooked, rebuild.Options{CatchUpTimeout: slowTimeout}, hash()).Run(ctx, rebuild.FromSlice(users(200)))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(codes) < 2 || codes[0] != -7 || codes[len(codes)-1] != 1 {
		t.Errorf("publish replies %v, want {-7} (too much work) first, then {1}", codes)
	}
	want := map[string]string{}
	for _, u := range us {
		want[u.Email] = u.ID
	}
	redistest.WantHash(t, other, key, want)
	redistest.WantClean(t, other, redistest.Prefix(t))
	// What the server spent in each publish script.
	entries, err := other.Do(ctx, other.B().SlowlogGet().Count(-1).Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	var slowest time.Duration
	for _, e := range entries {
		f, _ := e.ToArray()
		if len(f) < 4 {
			continue
		}
		args, _ := f[3].AsStrSlice()
		if len(args) > 1 && args[0] == "EVALSHA" && args[1] == publish.SHA1 {
			us, _ := f[2].AsInt64()
			slowest = max(slowest, time.Duration(us)*time.Microsecond)
		}
	}
	t.Logf("publishes %v, Stats.Changes %d, slowest publish script over 1 ms: %v (0: none)", codes, stats.Changes, slowest)
}

func TestTrustLargeFamilyShortLease(t *testing.T) {
	// C80: a SetIndex of 200,000 buckets, rebuilt over 200,000 live ones,
	// with a 10 s lease, on a server slow enough (a hook delays each
	// refresh script by 12 ms) that refreshing the temp keys takes about
	// 5 s, 400 scripts, longer than the lease's third between two
	// refreshes. (A 5 s lease also shows it, but leaves a loaded machine
	// running -race too little time between the heartbeats.) The refresh runs in a goroutine of its own and does not
	// hold the heartbeats back, and the temp keys' TTL grows to cover it
	// (logged): the run publishes every bucket exactly, and leaves nothing.
	// Before, the refresh ran in the lease's loop and starved the
	// heartbeats: the run failed with "rebuild lock lost" (or, with
	// guards, "context canceled" from a guard's TYPE).
	t.Parallel()
	srv := redistest.OwnServer(t)
	c := srv.Client(t)
	ctx := slowCtx(t) // 400,000 keys written: minutes under -race on a loaded machine
	prefix := redistest.Prefix(t) + "by-id"
	const n = 200_000
	refresh := redistest.ScriptNamed("refresh")
	var refreshes atomic.Int64
	slow := rueidishook.WithHook(c, redistest.Hook{
		OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			if refresh.Is(cmd.Commands()) {
				refreshes.Add(1)
				time.Sleep(12 * time.Millisecond) // the slow server the test is about, not a wait
			}
			return c.Do(ctx, cmd)
		},
	})
	src := rebuild.FromSeq2(func(yield func(int, error) bool) {
		for i := range n {
			if !yield(i, nil) {
				return
			}
		}
	})
	b := builders.SetIndex(prefix, func(i int) (string, string, bool) { return strconv.Itoa(i), "m", true })
	if _, err := redistest.Rebuilder(t, c, rebuild.Options{MaxKeys: -1}, b).Run(ctx, src); err != nil {
		t.Fatalf("first run: %v", err)
	}
	rec := newLogRecorder()
	r := redistest.Rebuilder(t, slow, rebuild.Options{TTL: 10 * time.Second, MaxKeys: -1, Logger: slog.New(rec),
		Guards: []rebuild.Guard{rebuild.RefuseEmpty()}}, b)
	// The source ends once a second refresh has started, the first one
	// measured: long enough for the temp keys' TTL to grow.
	grown := func() bool { return len(rec.matching("their TTL grows")) > 0 }
	stats, err := r.Run(ctx, rebuild.FromSeq2(func(yield func(int, error) bool) {
		for i := range n {
			if !yield(i, nil) {
				return
			}
		}
		deadline := time.Now().Add(time.Minute)
		for !grown() && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond) // polling the log while the run goes on: that is the test
		}
	}))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := len(stats.Outcomes); got != n {
		t.Errorf("published %d buckets, want %d", got, n)
	}
	got := redistest.LiveKeys(t, c, prefix+":")
	if len(got) != n {
		t.Errorf("%d buckets live, want %d", len(got), n)
	}
	for _, i := range []int{0, 1, n / 2, n - 1} {
		b := prefix + ":" + strconv.Itoa(i)
		if m := redistest.SMembers(t, c, b); !slices.Equal(m, []string{"m"}) || redistest.PTTL(t, c, b) != -1 {
			t.Errorf("%s: %q, PTTL %v; want [m], no TTL", b, m, redistest.PTTL(t, c, b))
		}
	}
	if !grown() {
		t.Errorf("the temp keys' TTL did not grow: no warning logged")
	}
	redistest.WantClean(t, c, redistest.Prefix(t))
	t.Logf("Run: %v, %d refresh scripts; %q", stats.Elapsed, refreshes.Load(), rec.matching("temp keys"))
}

func TestTrustRefreshStopsWhenTheLeaseEnds(t *testing.T) {
	// C80, C61: a refresh in progress when the lease ends (the run goes on to its
	// publish) stops at its next chunk: the publish waits for the lease's
	// goroutines, so a refresh that went on through its chunks held the
	// publish back while the locks' TTL ran out (a large family on a slow
	// server then failed its publish with "rebuild lock lost"). A hook makes
	// each refresh chunk slow (the server the test is about), and the source
	// ends once the first refresh has sent its first chunk. A refresh that
	// went on to its end would send its 19 other chunks before the publish;
	// one that stops sends the chunk in flight and, on a loaded machine
	// where the run takes a moment to end its lease after the source, a
	// few more: at most 5 pass.
	t.Parallel()
	srv := redistest.OwnServer(t)
	c := srv.Client(t)
	ctx := redistest.Ctx(t)
	prefix := redistest.Prefix(t) + "by-id"
	const n = 20 * 500 // twenty refresh chunks
	refresh, publish := redistest.ScriptNamed("refresh"), redistest.ScriptNamed("publish")
	var chunks, fullChunks, afterSource, atPublish atomic.Int64
	var sourceDone atomic.Bool
	slow := rueidishook.WithHook(c, redistest.Hook{
		OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			switch {
			case refresh.Is(cmd.Commands()):
				chunks.Add(1)
				// EVALSHA sha numkeys lock temp...: C61's bound on a chunk.
				if n, err := strconv.Atoi(cmd.Commands()[2]); err != nil || n-1 > 500 {
					t.Errorf("a refresh script of %q keys, want at most 500 temp keys and the lock", cmd.Commands()[2])
				} else if n-1 == 500 {
					fullChunks.Add(1)
				}
				if sourceDone.Load() {
					afterSource.Add(1)
				}
				time.Sleep(300 * time.Millisecond) // the slow server the test is about, not a wait
			case publish.Is(cmd.Commands()):
				atPublish.Store(afterSource.Load())
			}
			return c.Do(ctx, cmd)
		},
	})
	b := builders.SetIndex(prefix, func(i int) (string, string, bool) { return strconv.Itoa(i), "m", true })
	r := redistest.Rebuilder(t, slow, rebuild.Options{TTL: 6 * time.Second}, b)
	stats, err := r.Run(ctx, rebuild.FromSeq2(func(yield func(int, error) bool) {
		for i := range n {
			if !yield(i, nil) {
				return
			}
		}
		deadline := time.Now().Add(time.Minute)
		for chunks.Load() == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond) // polling for the first refresh while the run goes on: that is the test
		}
		sourceDone.Store(true)
	}))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := len(stats.Outcomes); got != n {
		t.Errorf("published %d buckets, want %d", got, n)
	}
	if fullChunks.Load() == 0 {
		t.Errorf("no refresh script carried 500 temp keys: the %d buckets were not chunked by 500", n)
	}
	if got := atPublish.Load(); got > 5 {
		t.Errorf("%d refresh chunks were sent after the source ended and before the publish, want at most 5 (the refresh went on after the lease ended)", got)
	}
	redistest.WantClean(t, c, redistest.Prefix(t))
}

func TestHeartbeatNotHeldBackBySlowRoundTrip(t *testing.T) {
	// C16+: a heartbeat rides in a batch's round trip, and the lock's TTL is
	// reset when that round trip reaches its end on the server. A round trip
	// slower than a heartbeat period (a large batch, a slow network) no
	// longer holds the next heartbeat back: it goes alone, and renews the
	// locks in time. A hook delays the first round trip that carries a
	// heartbeat by 2.5 s, with a lease of 3 s (a heartbeat every second):
	// that heartbeat reaches the server after the lock would have expired,
	// and before, the run failed with ErrLockLost. The source is paced
	// (MaxRate) so that batches go out when the heartbeat is due.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		key := d.Prefix + "by-id"
		heartbeat := redistest.ScriptNamed("heartbeat")
		var delayed atomic.Bool
		slow := rueidishook.WithHook(d.Client, redistest.Hook{
			OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
				if n := len(multi); n > 1 && heartbeat.Is(multi[n-1].Commands()) && delayed.CompareAndSwap(false, true) {
					time.Sleep(2500 * time.Millisecond) // the slow round trip the test is about, not a wait
					return c.DoMulti(context.WithoutCancel(ctx), multi...)
				}
				return c.DoMulti(ctx, multi...)
			},
		})
		const n = 6000
		b := builders.Hash(key, func(i int) (string, string, bool) { return strconv.Itoa(i), "v", true })
		r := redistest.Rebuilder(t, slow, rebuild.Options{TTL: 3 * time.Second, BatchSize: 100, MaxRate: 2000}, b)
		if _, err := r.Run(redistest.Ctx(t), rebuild.FromSeq2(func(yield func(int, error) bool) {
			for i := range n {
				if !yield(i, nil) {
					return
				}
			}
		})); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if !delayed.Load() {
			t.Fatalf("no heartbeat rode in a batch's round trip")
		}
		if got := len(redistest.HGetAll(t, d.Other, key)); got != n {
			t.Errorf("%s has %d fields, want %d", key, got, n)
		}
		redistest.WantClean(t, d.Other, d.Prefix)
	})
}

// slowTimeout bounds the tests that write hundreds of thousands of keys or
// changes: what they check is not their speed, and under -race on a loaded
// machine they take minutes.
const slowTimeout = 5 * time.Minute

// slowCtx returns a context that ends after slowTimeout, or with the test.
func slowCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), slowTimeout)
	t.Cleanup(cancel)
	return ctx
}
