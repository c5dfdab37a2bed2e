package rebuild_test

// Bad input (C5+, C42): every invalid option or builder set is a clear
// *rebuild.Error of Op "config", returned by New, which never touches
// Redis, so that nothing is written: no lock, no temp key. A nil source is
// the same error from Run, before it touches Redis. Programming errors (a
// nil client or builder) panic in New with a "keyswap: " message.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
)

// cfgHash, cfgZset and cfgIndex are builders of users for the config
// tests.
func cfgHash(key string) rebuild.Builder[user] {
	return builders.Hash(key, func(u user) (string, string, bool) { return u.Email, u.ID, true })
}

func cfgZset(key string) rebuild.Builder[user] {
	return builders.SortedSet(key, func(u user) (string, float64, bool) { return u.ID, u.Score, true })
}

func cfgIndex(prefix string) rebuild.Builder[user] {
	return builders.SetIndex(prefix, func(u user) (string, string, bool) { return u.Country, u.ID, true })
}

// cfgSource returns a source of n users that records in *read that it was
// read.
func cfgSource(n int, read *bool) rebuild.Source[user] {
	return rebuild.FromSeq2(func(yield func(user, error) bool) {
		*read = true
		for _, u := range users(n) {
			if !yield(u, nil) {
				return
			}
		}
	})
}

// cfgWantRefused checks that New refused the configuration: it returned no
// Rebuilder and a config error whose message holds every string of want.
func cfgWantRefused[T any](t *testing.T, r *rebuild.Rebuilder[T], err error, want ...string) {
	t.Helper()
	if r != nil {
		t.Errorf("New: got a Rebuilder with error %v, want nil", err)
	}
	cfgWantConfigError(t, err, want...)
}

// cfgWantConfigError checks that err is a *rebuild.Error of Op "config"
// whose message holds every string of want.
func cfgWantConfigError(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want a config error mentioning %q", want)
	}
	var e *rebuild.Error
	if !errors.As(err, &e) || e.Op != "config" {
		t.Fatalf("got %T %v, want a *rebuild.Error of Op %q", err, err, "config")
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Run: got %q, want it to mention %q", err, w)
		}
	}
}

// cfgWantNothingWritten fails if any key exists under prefix.
func cfgWantNothingWritten(t *testing.T, c rueidis.Client, prefix string) {
	t.Helper()
	if ks := redistest.Keys(t, c, prefix); len(ks) > 0 {
		t.Errorf("keys under %q: got %q, want none", prefix, ks)
	}
}

// TestConfigInvalid: each invalid option or builder set gives an Op
// "config" error that says what is wrong, and writes nothing.
func TestConfigInvalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		opts     rebuild.Options
		builders func(p string) []rebuild.Builder[user]
		want     func(p string) []string
	}{
		{
			name: "BatchSize negative", opts: rebuild.Options{BatchSize: -1},
			want: func(string) []string { return []string{"BatchSize -1", "negative"} },
		},
		{
			name: "Writers negative", opts: rebuild.Options{Writers: -2},
			want: func(string) []string { return []string{"Writers -2", "negative"} },
		},
		{
			name: "TTL negative", opts: rebuild.Options{TTL: -time.Second},
			want: func(string) []string { return []string{"TTL -1s", "negative"} },
		},
		{
			name: "TTL 500ms", opts: rebuild.Options{TTL: 500 * time.Millisecond},
			want: func(string) []string { return []string{"TTL 500ms", "at least 1s"} },
		},
		{
			name: "TTL 1.5s", opts: rebuild.Options{TTL: 1500 * time.Millisecond},
			want: func(string) []string { return []string{"TTL 1.5s", "whole number of seconds"} },
		},
		{
			name: "LatencyBudget negative", opts: rebuild.Options{LatencyBudget: -time.Millisecond},
			want: func(string) []string { return []string{"LatencyBudget -1ms", "negative"} },
		},
		{
			name: "PreserveFor negative", opts: rebuild.Options{PreserveFor: -time.Minute},
			want: func(string) []string { return []string{"PreserveFor -1m0s", "negative"} },
		},
		{
			name: "PreserveFor 1.5s", opts: rebuild.Options{PreserveFor: 1500 * time.Millisecond},
			want: func(string) []string { return []string{"PreserveFor 1.5s", "whole number of seconds"} },
		},
		{
			name:     "no builders",
			builders: func(string) []rebuild.Builder[user] { return nil },
			want:     func(string) []string { return []string{"no builders"} },
		},
		{
			name:     "empty Hash key",
			builders: func(p string) []rebuild.Builder[user] { return []rebuild.Builder[user]{cfgZset(p + "z"), cfgHash("")} },
			want:     func(string) []string { return []string{"builder 1", "empty key"} },
		},
		{
			name:     "empty SetIndex prefix",
			builders: func(p string) []rebuild.Builder[user] { return []rebuild.Builder[user]{cfgIndex("")} },
			want:     func(string) []string { return []string{"builder 0", "empty key"} },
		},
		// C60: a builder key with the shape of keyswap's own keys.
		{
			name:     "Hash key shaped like a lock",
			builders: func(p string) []rebuild.Builder[user] { return []rebuild.Builder[user]{cfgHash(p + "k:rebuild-lock")} },
			want:     func(p string) []string { return []string{p + "k:rebuild-lock", "builder 0", "has the shape of"} },
		},
		{
			name: "Hash key shaped like a record",
			builders: func(p string) []rebuild.Builder[user] {
				return []rebuild.Builder[user]{cfgZset(p + "z"), cfgHash(p + "k:rebuild-lock:run")}
			},
			want: func(p string) []string { return []string{p + "k:rebuild-lock:run", "builder 1", "has the shape of"} },
		},
		{
			name: "SetIndex prefix shaped like a meta",
			builders: func(p string) []rebuild.Builder[user] {
				return []rebuild.Builder[user]{cfgIndex(p + "idx:rebuild-gen")}
			},
			want: func(p string) []string { return []string{p + "idx:rebuild-gen", "has the shape of"} },
		},
		{
			name: "Hash key shaped like a temp key",
			builders: func(p string) []rebuild.Builder[user] {
				return []rebuild.Builder[user]{cfgHash(p + "k:rebuild:1600000000:0123456789abcdef")}
			},
			want: func(p string) []string {
				return []string{p + "k:rebuild:1600000000:0123456789abcdef", "has the shape of"}
			},
		},
		{
			name: "two builders on one key",
			builders: func(p string) []rebuild.Builder[user] {
				return []rebuild.Builder[user]{cfgHash(p + "k"), cfgZset(p + "k")}
			},
			want: func(p string) []string { return []string{"builders 0 and 1", p + "k"} },
		},
		{
			name: "Hash key equal to a SetIndex prefix",
			builders: func(p string) []rebuild.Builder[user] {
				return []rebuild.Builder[user]{cfgIndex(p + "idx"), cfgHash(p + "idx")}
			},
			want: func(p string) []string { return []string{"builders 0 and 1", p + "idx"} },
		},
		{
			name: "Hash key inside a SetIndex prefix",
			builders: func(p string) []rebuild.Builder[user] {
				return []rebuild.Builder[user]{cfgIndex(p + "idx"), cfgHash(p + "idx:fr")}
			},
			want: func(p string) []string { return []string{p + "idx:fr", "inside the family", p + "idx:*"} },
		},
		{
			name: "SetIndex prefix around an earlier Hash key",
			builders: func(p string) []rebuild.Builder[user] {
				return []rebuild.Builder[user]{cfgHash(p + "idx:fr"), cfgIndex(p + "idx")}
			},
			want: func(p string) []string { return []string{p + "idx:fr", "inside the family", p + "idx:*"} },
		},
		{
			name: "nested SetIndex prefixes",
			builders: func(p string) []rebuild.Builder[user] {
				return []rebuild.Builder[user]{cfgIndex(p + "idx"), cfgIndex(p + "idx:sub")}
			},
			want: func(p string) []string { return []string{p + "idx:sub", "inside the family", p + "idx:*"} },
		},
		{
			name: "nested SetIndex prefixes, inner first",
			builders: func(p string) []rebuild.Builder[user] {
				return []rebuild.Builder[user]{cfgIndex(p + "idx:sub"), cfgIndex(p + "idx")}
			},
			want: func(p string) []string { return []string{p + "idx:sub", "inside the family", p + "idx:*"} },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			forEachDeployment(t, func(t *testing.T, d deployment) {
				bs := []rebuild.Builder[user]{cfgHash(d.Prefix + "h")}
				if tc.builders != nil {
					bs = tc.builders(d.Prefix)
				}
				r, err := rebuild.New(d.Client, tc.opts, bs...)
				cfgWantRefused(t, r, err, tc.want(d.Prefix)...)
				cfgWantNothingWritten(t, d.Other, d.Prefix)
			})
		})
	}
}

// TestConfigAcceptsNeighbours: the family checks are exact. Keys that share
// a family's prefix without its ":" are not inside it, and the rebuild runs.
func TestConfigAcceptsNeighbours(t *testing.T) {
	t.Parallel()
	forEachDeployment(t, func(t *testing.T, d deployment) {
		p := d.Prefix
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{}, cfgIndex(p+"idx"), cfgHash(p+"idxfr"), cfgIndex(p+"idx2"), cfgZset(p+"id"))
		if _, err := r.Run(redistest.Ctx(t), rebuild.FromSlice(users(30))); err != nil {
			t.Fatalf("Run: got %v, want success", err)
		}
		for _, k := range []string{p + "idx:fr", p + "idx2:de", p + "idxfr"} {
			if ks := redistest.Keys(t, d.Other, k); len(ks) == 0 {
				t.Errorf("key %s: got none, want it published", k)
			}
		}
		redistest.WantClean(t, d.Other, p)
	})
}

// TestConfigNilSource: a nil source is an Op "config" error.
func TestConfigNilSource(t *testing.T) {
	t.Parallel()
	forEachDeployment(t, func(t *testing.T, d deployment) {
		_, err := redistest.Rebuilder(t, d.Client, rebuild.Options{}, cfgHash(d.Prefix+"h")).Run(redistest.Ctx(t), nil)
		cfgWantConfigError(t, err, "nil source")
		cfgWantNothingWritten(t, d.Other, d.Prefix)
	})
}

// TestConfigNewPanics: a nil client or a nil builder is a programming error:
// New panics with a message that starts with "keyswap: ".
func TestConfigNewPanics(t *testing.T) {
	t.Parallel()
	client := env.Standalone.Client(t)
	p := redistest.Prefix(t)
	for _, tc := range []struct {
		name string
		new  func()
		want string
	}{
		{"nil client", func() { rebuild.New[user](nil, rebuild.Options{}, cfgHash(p+"h")) }, "rueidis.Client"},
		{"nil builder", func() { rebuild.New(client, rebuild.Options{}, cfgHash(p+"h"), nil) }, "builder 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				v := recover()
				msg := fmt.Sprint(v)
				if err, ok := v.(error); ok {
					msg = err.Error()
				}
				if v == nil || !strings.HasPrefix(msg, "keyswap: ") || !strings.Contains(msg, tc.want) {
					t.Errorf("New: got panic %#v, want one starting %q that mentions %q", v, "keyswap: ", tc.want)
				}
			}()
			tc.new()
		})
	}
}

// TestConfigClusterSlots: on Redis Cluster every key of one Rebuilder must
// share a hash slot, for the single-slot publish script (C5+). Builders in different slots, or a family
// prefix without a hash tag (whose buckets would spread), are refused with
// an error that names the keys and suggests a hash tag. The same builders
// are fine on a standalone server.
func TestConfigClusterSlots(t *testing.T) {
	t.Parallel()
	p := redistest.Prefix(t) // no hash tag
	t.Cleanup(func() {
		for _, c := range []rueidis.Client{env.Standalone.Client(t), env.Cluster.Client(t)} {
			for _, k := range redistest.Keys(t, c, p) {
				c.Do(context.Background(), c.B().Del().Key(k).Build())
			}
		}
	})
	a := p + "a"
	b := ""
	for i := 0; b == ""; i++ {
		if k := fmt.Sprintf("%sb%d", p, i); env.Cluster.KeySlot(t, k) != env.Cluster.KeySlot(t, a) {
			b = k
		}
	}
	for _, tc := range []struct {
		name     string
		builders []rebuild.Builder[user]
		want     []string
	}{
		{"different slots", []rebuild.Builder[user]{cfgHash(a), cfgZset(b)}, []string{a, b, "different hash slots", "hash tag"}},
		{"untagged SetIndex prefix", []rebuild.Builder[user]{cfgIndex(p + "idx")}, []string{p + "idx", "hash tag", "{" + p + "idx}"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read := false
			cluster, other := env.Cluster.Client(t), env.Cluster.Client(t)
			r, err := rebuild.New(cluster, rebuild.Options{}, tc.builders...)
			cfgWantRefused(t, r, err, tc.want...)
			cfgWantNothingWritten(t, other, p)

			standalone := env.Standalone.Client(t)
			if _, err := redistest.Rebuilder(t, standalone, rebuild.Options{}, tc.builders...).Run(redistest.Ctx(t), cfgSource(30, &read)); err != nil {
				t.Errorf("standalone: got %v, want success", err)
			}
			redistest.WantClean(t, standalone, p)
		})
	}

	t.Run("one untagged key", func(t *testing.T) {
		cluster := env.Cluster.Client(t)
		key := p + "single"
		if _, err := redistest.Rebuilder(t, cluster, rebuild.Options{}, cfgHash(key)).Run(redistest.Ctx(t), rebuild.FromSlice(users(30))); err != nil {
			t.Fatalf("Run: got %v, want success: one key is always in one slot", err)
		}
		if got := len(redistest.HGetAll(t, cluster, key)); got != 30 {
			t.Errorf("HLEN %s: got %d, want 30", key, got)
		}
		redistest.WantClean(t, cluster, key)
	})
}

// TestConfigBuilderOutsideItsKeys: a builder that writes outside the keys it
// owns (another key, another builder's key, an empty bucket of a family, the
// live key, the lock, a second key of a command, a script's key, or on a
// cluster a key in another slot) fails the run with Op "build" in the batch
// that does it, before anything of that batch is sent, and nothing is
// published (C45, C52).
func TestConfigBuilderOutsideItsKeys(t *testing.T) {
	t.Parallel()
	forEachDeployment(t, func(t *testing.T, d deployment) {
		elsewhere := "" // on the cluster, an untagged key outside d.Prefix's slot
		if d.Cluster {
			for i := 0; elsewhere == ""; i++ {
				k := fmt.Sprintf("%selsewhere%d", redistest.Prefix(t), i)
				if env.Cluster.KeySlot(t, k) != env.Cluster.KeySlot(t, d.Prefix) {
					elsewhere = k
				}
			}
		}
		for i, tc := range []struct {
			name        string
			cluster     bool // only on the cluster
			bad         func(c *rebuild.Commands, p string) error
			emptyBucket bool // the SetIndex maps u003000 to bucket ""
			owner       string
			want        string
		}{
			{name: "Temp of another key", owner: "k", want: "does not own", bad: func(c *rebuild.Commands, p string) error {
				_, err := c.Temp(p + "other")
				return err
			}},
			{name: "Temp of another builder's key", owner: "k", want: "does not own", bad: func(c *rebuild.Commands, p string) error {
				_, err := c.Temp(p + "h")
				return err
			}},
			{name: "Temp of a family's prefix", owner: "k", want: "does not own", bad: func(c *rebuild.Commands, p string) error {
				_, err := c.Temp(p + "idx:fr")
				return err
			}},
			{name: "SetIndex empty bucket", owner: "idx", want: "followed by a bucket", emptyBucket: true},
			// 11.6, C63: a command's keys must all be the builder's temp
			// keys, on standalone as on a cluster; nothing of the batch is sent.
			{name: "command on another key", owner: "k", want: "is not one of this run's temp keys", bad: func(c *rebuild.Commands, p string) error {
				c.Add(c.B().Sadd().Key(p+"other").Member("m").Build(), 1)
				return nil
			}},
			{name: "command on the live key", owner: "k", want: "is not one of this run's temp keys", bad: func(c *rebuild.Commands, p string) error {
				c.Add(c.B().Sadd().Key(p+"k").Member("m").Build(), 1)
				return nil
			}},
			{name: "command on the lock", owner: "k", want: "is not one of this run's temp keys", bad: func(c *rebuild.Commands, p string) error {
				c.Add(c.B().Set().Key(p+"k:rebuild-lock").Value("x").Build(), 1)
				return nil
			}},
			{name: "second key of a command", owner: "k", want: "is not one of this run's temp keys", bad: func(c *rebuild.Commands, p string) error {
				temp, err := c.Temp(p + "k")
				if err != nil {
					return err
				}
				c.Add(c.B().Sunionstore().Destination(temp).Key(temp, p+"other").Build(), 1)
				return nil
			}},
			{name: "script on another key", owner: "k", want: "is not one of this run's temp keys", bad: func(c *rebuild.Commands, p string) error {
				c.Add(c.B().Eval().Script("return 1").Numkeys(1).Key(p+"other").Build(), 1)
				return nil
			}},
			{name: "arbitrary command on another builder's key", owner: "k", want: "is not one of this run's temp keys", bad: func(c *rebuild.Commands, p string) error {
				c.Add(c.B().Arbitrary("HSET").Keys(p+"h").Args("f", "v").Build(), 1)
				return nil
			}},
			{name: "command in another slot", cluster: true, want: "outside the rebuild's hash slot", bad: func(c *rebuild.Commands, p string) error {
				c.Add(c.B().Sadd().Key(elsewhere).Member("m").Build(), 1)
				return nil
			}},
		} {
			if tc.cluster && !d.Cluster {
				continue
			}
			t.Run(tc.name, func(t *testing.T) {
				p := fmt.Sprintf("%sc%d:", d.Prefix, i)
				shape := func(bad bool) []rebuild.Builder[user] {
					return []rebuild.Builder[user]{
						cfgHash(p + "h"),
						builders.SetIndex(p+"idx", func(u user) (string, string, bool) {
							if bad && tc.emptyBucket && u.ID == "u003000" {
								return "", u.ID, true
							}
							return u.Country, u.ID, true
						}),
						builders.Func(p+"k", func(c *rebuild.Commands, items []user) error {
							if bad && tc.bad != nil && items[0].ID == "u003000" {
								if err := tc.bad(c, p); err != nil {
									return err
								}
							}
							temp, err := c.Temp(p + "k")
							if err != nil {
								return err
							}
							c.Add(c.B().Sadd().Key(temp).Member(items[0].ID).Build(), 1)
							return nil
						}),
					}
				}
				if _, err := redistest.Rebuilder(t, d.Client, rebuild.Options{}, shape(false)...).Run(redistest.Ctx(t), rebuild.FromSlice(users(100))); err != nil {
					t.Fatalf("first run: %v", err)
				}
				before := redistest.Snapshot(t, d.Other, p)
				if live := redistest.LiveKeys(t, d.Other, p); len(live) != 5 {
					t.Fatalf("first run: got live keys %q, want 5", live)
				}

				_, err := redistest.Rebuilder(t, d.Client, rebuild.Options{BatchSize: 1000}, shape(true)...).Run(redistest.Ctx(t), rebuild.FromSlice(users(6000)))
				var e *rebuild.Error
				if !errors.As(err, &e) || e.Op != "build" || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Run: got %v, want a *rebuild.Error of Op %q mentioning %q", err, "build", tc.want)
				}
				if tc.owner != "" && e.Key != p+tc.owner {
					t.Errorf("Run: got Key %q, want the faulty builder's %q", e.Key, p+tc.owner)
				}
				redistest.WantUnchanged(t, d.Other, p, before)
				redistest.WantClean(t, d.Other, p)
				if elsewhere != "" {
					cfgWantNothingWritten(t, d.Other, elsewhere)
				}
			})
		}
	})
}

// TestConfigClosedClient: a closed client fails the run at once, at the
// lock, with an error that errors.Is matches to rueidis.ErrClosing, and
// nothing is written.
//
// Standalone only: rueidis v1.0.79's cluster client closes its connections
// in background goroutines (clusterClient.Close: go cc.conn.Close()), and a
// cluster client closed right after it was created sometimes keeps serving
// commands for good (seen here: GET still answered 100 ms after Close, and
// Run took the locks), presumably through a connection its startup
// topology refresh installed after Close.
func TestConfigClosedClient(t *testing.T) {
	t.Parallel()
	c, other := env.Standalone.Client(t), env.Standalone.Client(t)
	p := redistest.Prefix(t)
	c.Close()
	read := false
	_, err := redistest.Rebuilder(t, c, rebuild.Options{}, cfgHash(p+"h"), cfgIndex(p+"idx")).Run(redistest.Ctx(t), cfgSource(100, &read))
	t.Logf("Run: %v", err)
	if !errors.Is(err, rueidis.ErrClosing) {
		t.Fatalf("Run: got %v, want an error matching rueidis.ErrClosing", err)
	}
	var e *rebuild.Error
	if !errors.As(err, &e) || e.Op != "acquire" {
		t.Errorf("Run: got %T %v, want a *rebuild.Error of Op %q", err, err, "acquire")
	}
	if read {
		t.Error("the source was read, want Run to fail before it")
	}
	cfgWantNothingWritten(t, other, p)
}
