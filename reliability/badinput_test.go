package reliability

// Bad input (issue item 5): each kind of bad input, through the public API,
// gives a clear error and writes nothing. The per-package tests
// (rebuild/config_test.go, the store tests) cover each check in detail;
// this one table runs them all against live keys, and checks for each that
// the error names the problem, and that the keyspace is left exactly as it
// was: no lock, no temp key, every live key and generation record
// byte-identical with the same TTL (guarantee 4, C7, C35, C42, C45, C52,
// C5+).

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

// badItem is the item type of the bad-input tests.
type badItem struct {
	I     int
	Value string
}

// badItems returns n items; item i has value "v<i>", or big if i == at.
func badItems(n, at int, big string) iter.Seq2[badItem, error] {
	return func(yield func(badItem, error) bool) {
		for i := range n {
			v := "v" + strconv.Itoa(i)
			if i == at {
				v = big
			}
			if !yield(badItem{I: i, Value: v}, nil) {
				return
			}
		}
	}
}

func badHash(key string) index.Builder[badItem] {
	return builders.Hash(key, func(it badItem) (string, string, bool) { return "f" + strconv.Itoa(it.I), it.Value, true })
}

func badZset(key string) index.Builder[badItem] {
	return builders.SortedSet(key, func(it badItem) (string, float64, bool) { return "m" + strconv.Itoa(it.I), float64(it.I), true })
}

func badIndex(prefix string) index.Builder[badItem] {
	return builders.SetIndex(prefix, func(it badItem) (string, string, bool) { return strconv.Itoa(it.I % 3), "m" + strconv.Itoa(it.I), true })
}

// badGood returns the builders of the live keys every case starts from.
func badGood(p string) []index.Builder[badItem] {
	return []index.Builder[badItem]{badHash(p + "h"), badZset(p + "z"), badIndex(p + "idx")}
}

// badStrayFamily is a family builder that, from item strayAt on, writes to
// stray, a key outside its prefix, as a buggy custom builder could.
type badStrayFamily struct {
	prefix, stray string
	strayAt       int
}

func (b *badStrayFamily) Key() string     { return b.prefix }
func (b *badStrayFamily) KeyType() string { return "set" }

func (b *badStrayFamily) Build(c *index.Commands, items []badItem) error {
	for _, it := range items {
		live := b.prefix + ":" + strconv.Itoa(it.I%3)
		if it.I >= b.strayAt {
			live = b.stray
		}
		temp, err := c.Temp(live)
		if err != nil {
			return err
		}
		c.Add(c.B().Sadd().Key(temp).Member("m"+strconv.Itoa(it.I)).Build(), 1)
	}
	return nil
}

// badOtherSlot returns a key under p's hash tag-free prefix that is in
// another slot than p on the cluster.
func badOtherSlot(t *testing.T, p string) string {
	t.Helper()
	base := redistest.Prefix(t) // no hash tag
	for i := 0; ; i++ {
		if k := fmt.Sprintf("%sother%d", base, i); env.Cluster.KeySlot(t, k) != env.Cluster.KeySlot(t, p) {
			return k
		}
	}
}

// TestBadInput: every kind of bad input of the list gives an error
// that names the problem, and changes nothing: no lock, no temp key, the
// live keys and their generation records as they were.
func TestBadInput(t *testing.T) {
	t.Parallel()
	const items, batch = 3000, 500 // a bad item at 1200 is in the third batch
	for _, tc := range []struct {
		name    string
		cluster bool     // on the cluster; otherwise on the standalone server
		server  []string // on a private standalone server started with these args
		// run makes the bad call on keys under p, through c.
		run  func(t *testing.T, c rueidis.Client, p string) error
		want []string // in the error message
		is   error    // errors.Is must match it, when not nil
		op   string   // the *rebuild.Error's Op, when not empty
		// panics: a programming error, which panics with a "keyswap: "
		// message instead of returning an error.
		panics bool
	}{
		{
			name: "empty key",
			run: func(t *testing.T, c rueidis.Client, p string) error {
				return badRun(c, rebuild.Options{}, badHash(p+"h"), badHash(""))
			},
			want: []string{"builder 1", "empty key"}, op: "config",
		},
		{
			name: "empty SetIndex prefix",
			run: func(t *testing.T, c rueidis.Client, p string) error {
				return badRun(c, rebuild.Options{}, badIndex(""))
			},
			want: []string{"builder 0", "empty key"}, op: "config",
		},
		{
			name: "TTL negative",
			run: func(t *testing.T, c rueidis.Client, p string) error {
				return badRun(c, rebuild.Options{TTL: -time.Second}, badGood(p)...)
			},
			want: []string{"TTL -1s", "negative"}, op: "config",
		},
		{
			name: "TTL under one second",
			run: func(t *testing.T, c rueidis.Client, p string) error {
				return badRun(c, rebuild.Options{TTL: 999 * time.Millisecond}, badGood(p)...)
			},
			want: []string{"TTL 999ms", "at least 1s"}, op: "config",
		},
		{
			name: "TTL not whole seconds",
			run: func(t *testing.T, c rueidis.Client, p string) error {
				return badRun(c, rebuild.Options{TTL: 2500 * time.Millisecond}, badGood(p)...)
			},
			want: []string{"TTL 2.5s", "whole number of seconds"}, op: "config",
		},
		{
			name: "BatchSize negative",
			run: func(t *testing.T, c rueidis.Client, p string) error {
				return badRun(c, rebuild.Options{BatchSize: -1}, badGood(p)...)
			},
			want: []string{"BatchSize -1", "negative"}, op: "config",
		},
		{
			name: "Writers negative",
			run: func(t *testing.T, c rueidis.Client, p string) error {
				return badRun(c, rebuild.Options{Writers: -1}, badGood(p)...)
			},
			want: []string{"Writers -1", "negative"}, op: "config",
		},
		{
			name: "nil builder",
			run: func(t *testing.T, c rueidis.Client, p string) error {
				return badRun(c, rebuild.Options{}, badHash(p+"h"), nil)
			},
			want: []string{"keyswap: ", "builder 1 is nil"}, panics: true,
		},
		{
			name: "two builders on one key",
			run: func(t *testing.T, c rueidis.Client, p string) error {
				return badRun(c, rebuild.Options{}, badHash(p+"h"), badZset(p+"z"), badZset(p+"h"))
			},
			want: []string{"builders 0 and 2", "both target key"}, op: "config",
		},
		{
			name: "family builder writes outside its prefix",
			run: func(t *testing.T, c rueidis.Client, p string) error {
				return badRunSource(c, rebuild.Options{BatchSize: batch}, badItems(items, -1, ""),
					badHash(p+"h"), badZset(p+"z"), &badStrayFamily{prefix: p + "idx", stray: p + "elsewhere", strayAt: 1200})
			},
			want: []string{"elsewhere", "followed by a bucket"}, op: "build",
		},
		{
			name: "builder writes another builder's key",
			run: func(t *testing.T, c rueidis.Client, p string) error {
				stray := builders.Func(p+"z", func(c *index.Commands, its []badItem) error {
					key := p + "z"
					if its[0].I >= 1000 {
						key = p + "h"
					}
					temp, err := c.Temp(key)
					if err != nil {
						return err
					}
					c.Add(c.B().Zadd().Key(temp).ScoreMember().ScoreMember(1, "m").Build(), 1)
					return nil
				})
				return badRunSource(c, rebuild.Options{BatchSize: batch}, badItems(items, -1, ""), badHash(p+"h"), stray, badIndex(p+"idx"))
			},
			want: []string{"does not own"}, op: "build",
		},
		{
			// Redis refuses a bulk string longer than proto-max-bulk-len
			// (512 MB by default, the most a value can hold): it replies
			// "Protocol error: invalid bulk length" and closes the
			// connection with the rest of the bulk unread, so the client
			// reads that reply or, as often, a reset. Sending 512 MB is
			// too much for the default run (see TestBadInputOver512MB), so
			// this server has the smallest limit, 1 MB, and the value is
			// 2 MB. The run must fail closed; its error is whichever of the
			// two the client saw, as it cannot know a lowered limit.
			name:   "value over the server's bulk limit",
			server: []string{"--proto-max-bulk-len", "1mb"},
			run: func(t *testing.T, c rueidis.Client, p string) error {
				return badRunSource(c, rebuild.Options{BatchSize: batch}, badItems(items, 1200, strings.Repeat("x", 2<<20)), badGood(p)...)
			},
			want: []string{"write"}, op: "write",
		},
		{
			name:    "cross-slot targets",
			cluster: true,
			run: func(t *testing.T, c rueidis.Client, p string) error {
				return badRun(c, rebuild.Options{}, badHash(p+"h"), badZset(badOtherSlot(t, p)))
			},
			want: []string{"different hash slots", "hash tag"}, op: "config",
		},
		{
			name:    "untagged family on a cluster",
			cluster: true,
			run: func(t *testing.T, c rueidis.Client, p string) error {
				return badRun(c, rebuild.Options{}, badIndex(strings.NewReplacer("{", "", "}", "").Replace(p)+"idx"))
			},
			want: []string{"no hash tag", "spread over many hash slots"}, op: "config",
		},
		{
			name:    "builder command in another slot",
			cluster: true,
			run: func(t *testing.T, c rueidis.Client, p string) error {
				other := badOtherSlot(t, p)
				stray := builders.Func(p+"z", func(c *index.Commands, its []badItem) error {
					temp, err := c.Temp(p + "z")
					if err != nil {
						return err
					}
					c.Add(c.B().Zadd().Key(temp).ScoreMember().ScoreMember(1, "m").Build(), 1)
					if its[0].I >= 1000 {
						c.Add(c.B().Sadd().Key(other).Member("m").Build(), 1)
					}
					return nil
				})
				return badRunSource(c, rebuild.Options{BatchSize: batch}, badItems(items, -1, ""), badHash(p+"h"), stray, badIndex(p+"idx"))
			},
			want: []string{"outside the rebuild's hash slot"}, op: "build",
		},
		{
			name: "closed client",
			run: func(t *testing.T, c rueidis.Client, p string) error {
				closed, err := raceClient([]string{env.Standalone.Addr}, false)
				if err != nil {
					t.Fatal(err)
				}
				closed.Close()
				return badRun(closed, rebuild.Options{}, badGood(p)...)
			},
			want: []string{"acquire", "closing"}, is: rueidis.ErrClosing, op: "acquire",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var c rueidis.Client
			p := redistest.Prefix(t)
			switch {
			case tc.server != nil:
				c = redistest.OwnServer(t, tc.server...).Client(t)
			case tc.cluster:
				c = env.Cluster.Client(t)
				p = raceTag(t)
			default:
				c = env.Standalone.Client(t)
			}
			raceFresh(t, c, p)
			// The live keys every case must leave alone: five, and the
			// generation record of each of the three builders' keys, at
			// generation 1.
			w := genWindow{from: time.Now()}
			if err := badRun(c, rebuild.Options{}, badGood(p)...); err != nil {
				t.Fatalf("first run: %v", err)
			}
			w.to = time.Now()
			before := redistest.Snapshot(t, c, p)
			live := []string{p + "h", p + "idx:0", p + "idx:1", p + "idx:2", p + "z"}
			want := slices.Clone(live)
			for _, k := range []string{p + "h", p + "z", p + "idx"} {
				want = append(want, keys.MetaKey(k, tc.cluster))
				if err := checkGeneration(t.Context(), c, k, tc.cluster, 1, w); err != nil {
					t.Fatalf("first run: %v", err)
				}
			}
			slices.Sort(want)
			if got := slices.Sorted(maps.Keys(before)); !slices.Equal(got, want) {
				t.Fatalf("first run: got keys %q, want %q", got, want)
			}
			if got := redistest.LiveKeys(t, c, p); !slices.Equal(got, live) {
				t.Fatalf("first run: got live keys %q, want %q", got, live)
			}

			var err error
			var panicked any
			func() {
				defer func() { panicked = recover() }()
				err = tc.run(t, c, p)
			}()
			msg := fmt.Sprint(err)
			switch {
			case tc.panics && panicked == nil:
				t.Fatalf("got error %v, want a panic", err)
			case tc.panics:
				msg = fmt.Sprint(panicked)
			case panicked != nil:
				t.Fatalf("got panic %v, want an error", panicked)
			case err == nil:
				t.Fatalf("got no error, want one mentioning %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("got %q, want it to mention %q", msg, w)
				}
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("got %v, want an error matching %v", err, tc.is)
			}
			if tc.op != "" {
				var e *rebuild.Error
				if !errors.As(err, &e) || e.Op != tc.op {
					t.Errorf("got %T %v, want a *rebuild.Error of Op %q", err, err, tc.op)
				}
			}

			if left := redistest.Leftovers(t, c, p); len(left) > 0 {
				t.Errorf("leftovers: got %q, want none", left)
			}
			if diff := cmp.Diff(before, redistest.Snapshot(t, c, p)); diff != "" {
				t.Errorf("live keys changed (-before +after):\n%s", diff)
			}
			t.Logf("%s", msg)
		})
	}
}

// TestBadInputZeroMeansDefault: zero is not bad input. A zero TTL,
// BatchSize or Writers means the default (Options' documentation), so a
// run with them succeeds, and its lock has the default TTL.
func TestBadInputZeroMeansDefault(t *testing.T) {
	t.Parallel()
	c := env.Standalone.Client(t)
	p := redistest.Prefix(t)
	raceFresh(t, c, p)
	var ttl int64
	src := func(yield func(badItem, error) bool) {
		var err error
		if ttl, err = c.Do(context.Background(), c.B().Ttl().Key(p+"h:rebuild-lock").Build()).AsInt64(); err != nil {
			yield(badItem{}, err)
			return
		}
		for it, err := range badItems(10, -1, "") {
			if !yield(it, err) {
				return
			}
		}
	}
	if err := badRunSource(c, rebuild.Options{TTL: 0, BatchSize: 0, Writers: 0}, src, badGood(p)...); err != nil {
		t.Fatalf("Run with zero options: got %v, want success", err)
	}
	if want := int64(rebuild.Defaults().TTL / time.Second); ttl != want {
		t.Errorf("lock TTL during the run: got %d s, want the default TTL, %d s", ttl, want)
	}
}

// badRun rebuilds builders from 100 good items.
func badRun(c rueidis.Client, opts rebuild.Options, bs ...index.Builder[badItem]) error {
	return badRunSource(c, opts, badItems(100, -1, ""), bs...)
}

func badRunSource(c rueidis.Client, opts rebuild.Options, src iter.Seq2[badItem, error], bs ...index.Builder[badItem]) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := rebuild.New(c, opts, bs...)
	if err != nil {
		return err
	}
	_, err = r.Run(ctx, sources.Seq2(src))
	return err
}
