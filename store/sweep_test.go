package store_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// sweepNow is the fixed clock of the sweep tests: "now" for every Store
// below. With OlderThan = 1h, a timestamp is old when < sweepCutoff.
var (
	sweepNow    = time.Unix(1_700_000_000, 0)
	sweepCutoff = sweepNow.Add(-time.Hour).Unix()
)

func sweepClock() func() time.Time { return func() time.Time { return sweepNow } }

// sweepTemp returns a current-shape temp key of base, stamped unix.
func sweepTemp(base string, unix int64, nonce string) string {
	return base + ":rebuild:" + strconv.FormatInt(unix, 10) + ":" + nonce
}

// sweepPattern is a SCAN pattern that sees only the keys of the running
// (sub)test, whatever hash tag a cluster key shape puts in front of them.
func sweepPattern(t *testing.T) string { return "*" + redistest.Prefix(t) + "*:rebuild:*" }

// sweepSet creates key as a string without a TTL, or with ttl when > 0.
func sweepSet(t *testing.T, c rueidis.Client, key string, ttl time.Duration) {
	t.Helper()
	if ttl > 0 {
		redistest.Cmd(t, c, "SET", key, "x", "EX", strconv.Itoa(int(ttl/time.Second)))
		return
	}
	redistest.Cmd(t, c, "SET", key, "x")
}

// sweepRun runs Sweep and returns its sorted result.
func sweepRun(t *testing.T, s *store.Store, opts store.SweepOptions) []string {
	t.Helper()
	got, err := s.Sweep(redistest.Ctx(t), opts)
	if err != nil {
		t.Fatalf("Sweep(%+v): %v", opts, err)
	}
	slices.Sort(got)
	return got
}

// sweepWant fails unless got equals want, both sorted.
func sweepWant(t *testing.T, what string, got, want []string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s: got %q, want %q (-want +got):\n%s", what, got, want, diff)
	}
}

// sweepDeployments is the standalone server and the cluster: the sweep
// itself does not depend on the live key's shape (see TestSweepKeyShapes
// for that), but it scans each deployment differently.
func sweepDeployments(t *testing.T) []target {
	t.Helper()
	return []target{
		{name: "standalone", client: env.Standalone.Client(t), other: env.Standalone.Client(t)},
		{name: "cluster", cluster: true, client: env.Cluster.Client(t), other: env.Cluster.Client(t)},
	}
}

// TestSweep is the sweep's decision table: C37, C38 (each condition),
// C39, C3 (the legacy shape, swept only with SweepOptions.Legacy), C4 (a
// lock is never swept), C5 (the recogniser decides, not the glob).
func TestSweep(t *testing.T) {
	for _, tg := range sweepDeployments(t) {
		for _, legacy := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/legacy=%v", tg.name, legacy), func(t *testing.T) {
				t.Parallel()
				sweepTable(t, tg, legacy)
			})
		}
	}
}

// sweepTable runs TestSweep's table on tg, with or without the legacy shape.
func sweepTable(t *testing.T, tg target, legacy bool) {
	{
		{
			p := redistest.Prefix(t)
			old := sweepCutoff - 1 // strictly older than the cutoff
			const nonce = "0123456789abcdef"
			type seed struct {
				key    string
				ttl    time.Duration
				swept  bool
				legacy bool // swept only with Legacy: the legacy shape
			}
			seeds := []seed{
				// C38 (1)-(4) all hold: swept.
				{key: sweepTemp(p+"old", old, nonce), swept: true},
				{key: sweepTemp(p+"ancient", 1, nonce), swept: true},
				// C5: nonce hex of either case.
				{key: sweepTemp(p+"upper", old, "0123456789ABCDEF"), swept: true},
				// C3: legacy shape without a nonce.
				{key: p + "legacy:rebuild:" + strconv.FormatInt(old, 10), swept: true, legacy: true},
				// C5: the base is everything before the suffix.
				{key: p + "nested:rebuild:1:rebuild:2", swept: true, legacy: true},
				{key: sweepTemp(p+"nested:rebuild:1", old, nonce), swept: true},
				// C38 (4): recent, or exactly at the cutoff (not strictly older).
				{key: sweepTemp(p+"recent", sweepNow.Unix()-10, nonce)},
				{key: sweepTemp(p+"edge", sweepCutoff, nonce)},
				{key: p + "legacyedge:rebuild:" + strconv.FormatInt(sweepCutoff, 10)},
				// A timestamp from the future (clock skew) is not old.
				{key: sweepTemp(p+"future", sweepNow.Unix()+3600, nonce)},
				// More digits than int64: never old.
				{key: p + "huge:rebuild:99999999999999999999999"},
				// C38 (3): a TTL means alive or preserved for diagnosis.
				{key: sweepTemp(p+"ttl", old, nonce), ttl: 600 * time.Second},
				// C38 (2): the base's lock vetoes, in both shapes.
				{key: sweepTemp(p+"locked", old, nonce)},
				{key: p + "locked:rebuild-lock", ttl: 600 * time.Second},
				{key: p + "legacylocked:rebuild:" + strconv.FormatInt(old, 10)},
				{key: p + "legacylocked:rebuild-lock", ttl: 600 * time.Second},
				// C4: a TTL-less lock (a crashed SET without EX, say)
				// is still never swept, and still vetoes.
				{key: sweepTemp(p+"bare", old, nonce)},
				{key: p + "bare:rebuild-lock"},
				// C5: the glob matches these, the recogniser does not.
				{key: p + "x:rebuild:123:abc"},
				{key: p + "x:rebuild:"},
				{key: p + "x:rebuild:12x"},
				{key: p + "x:rebuild:1:0123456789abcde"},   // 15 hex digits
				{key: p + "x:rebuild:1:0123456789abcdef0"}, // 17
				{key: p + "x:rebuild:1:0123456789abcdeg"},
				{key: p + "x:rebuild::0123456789abcdef"},
				{key: p + "x:rebuild:1:0123456789abcdef:suffix"},
				// Outside the pattern: never looked at.
				{key: p + "other:rebuilt:1:0123456789abcdef"},
			}
			var want []string
			for i, sd := range seeds {
				sweepSet(t, tg.other, sd.key, sd.ttl)
				seeds[i].swept = sd.swept && (legacy || !sd.legacy)
				if seeds[i].swept {
					want = append(want, sd.key)
				}
			}
			s := store.New(tg.client, store.Options{Now: sweepClock()})
			opts := store.SweepOptions{Pattern: sweepPattern(t), OlderThan: time.Hour, Legacy: legacy}

			// C37: DryRun reports the same list and deletes nothing.
			dry := opts
			dry.DryRun = true
			sweepWant(t, "dry run", sweepRun(t, s, dry), want)
			for _, sd := range seeds {
				if !redistest.Exists(t, tg.other, sd.key) {
					t.Errorf("dry run deleted %s", sd.key)
				}
			}

			sweepWant(t, "sweep", sweepRun(t, s, opts), want)
			for _, sd := range seeds {
				switch {
				case sd.swept:
					redistest.WantAbsent(t, tg.other, sd.key)
				case sd.ttl > 0:
					redistest.WantTTL(t, tg.other, sd.key, sd.ttl)
				default:
					if v, ok := redistest.Get(t, tg.other, sd.key); !ok || v != "x" {
						t.Errorf("%s = %q (present %v), want it kept as %q", sd.key, v, ok, "x")
					}
					if got := redistest.PTTL(t, tg.other, sd.key); got != -1 {
						t.Errorf("%s: PTTL %v, want -1 (untouched)", sd.key, got)
					}
				}
			}

			// Nothing left to sweep.
			sweepWant(t, "second sweep", sweepRun(t, s, opts), nil)

			// The veto lasts as long as the lock: once it is gone, the
			// orphan is swept. The lock itself never is.
			redistest.Cmd(t, tg.other, "DEL", p+"locked:rebuild-lock")
			sweepWant(t, "after unlock", sweepRun(t, s, opts), []string{sweepTemp(p+"locked", old, nonce)})
			redistest.WantString(t, tg.other, p+"bare:rebuild-lock", "x")
		}
	}
}

// TestSweepLeavesApplicationKeys (C3): keys of the application whose names
// have the legacy shape, TTL-less hashes such as ci:rebuild:12345, are
// never deleted by a default sweep: keyswap never makes that shape, so it
// cannot prove it made them. They are swept only with Legacy, as
// documented.
func TestSweepLeavesApplicationKeys(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg target) {
		p := redistest.Prefix(t)
		appKeys := []string{p + "ci:rebuild:12345", p + "jobs:rebuild:20240101", p + "build:42:rebuild:7"}
		for _, k := range appKeys {
			redistest.SeedHash(t, tg.other, k, map[string]string{"owner": "the application"})
		}
		before := redistest.Snapshot(t, tg.other, p)
		s := store.New(tg.client, store.Options{Now: sweepClock()})
		for _, opts := range []store.SweepOptions{{Pattern: sweepPattern(t)}, {Pattern: p + "*", OlderThan: time.Second}} {
			if got := sweepRun(t, s, opts); len(got) != 0 {
				t.Errorf("Sweep(%+v) deleted %q, want nothing: these keys are the application's", opts, got)
			}
		}
		redistest.WantUnchanged(t, tg.other, p, before)
		got := sweepRun(t, s, store.SweepOptions{Pattern: sweepPattern(t), Legacy: true})
		sweepWant(t, "with Legacy", got, appKeys)
	})
}

// TestSweepFamilyLock: a SetIndex family locks its prefix, and its buckets'
// temp keys derive from the bucket keys below it. The sweep checks the lock
// of every ':'-prefix of the base (C38 (2), C39).
func TestSweepFamilyLock(t *testing.T) {
	for _, tg := range sweepDeployments(t) {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			p := redistest.Prefix(t)
			old := sweepCutoff - 60
			buckets := []string{
				sweepTemp(p+"fam:us", old, "00000000000000aa"),
				sweepTemp(p+"fam:de:berlin", old, "00000000000000bb"),
				p + "fam:fr:rebuild:" + strconv.FormatInt(old, 10), // legacy
			}
			// Not a ':'-prefix of "fam": a lock on "fa" protects nothing.
			stranger := sweepTemp(p+"family:us", old, "00000000000000cc")
			for _, k := range append(slices.Clone(buckets), stranger) {
				sweepSet(t, tg.other, k, 0)
			}
			famLock := p + "fam:rebuild-lock"
			sweepSet(t, tg.other, famLock, 600*time.Second)
			sweepSet(t, tg.other, p+"fa:rebuild-lock", 600*time.Second)

			s := store.New(tg.client, store.Options{Now: sweepClock()})
			opts := store.SweepOptions{Pattern: sweepPattern(t), OlderThan: time.Hour, Legacy: true}
			sweepWant(t, "with the family lock", sweepRun(t, s, opts), []string{stranger})
			for _, k := range buckets {
				if !redistest.Exists(t, tg.other, k) {
					t.Errorf("%s was swept while %s is held", k, famLock)
				}
			}
			redistest.WantTTL(t, tg.other, famLock, 600*time.Second)

			redistest.Cmd(t, tg.other, "DEL", famLock)
			sweepWant(t, "without it", sweepRun(t, s, opts), buckets)
			for _, k := range buckets {
				redistest.WantAbsent(t, tg.other, k)
			}
		})
	}
}

// TestSweepOptions: C33 defaults (pattern "*:rebuild:*", OlderThan 3600 s)
// and the refusal of a negative OlderThan. The default pattern sees every
// key, so this runs on a server of its own.
func TestSweepOptions(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t)
	c := srv.Client(t)
	now := sweepNow.Unix()
	const nonce = "fedcba9876543210"
	oldest := sweepTemp("a", now-3601, nonce) // older than the default hour
	atHour := sweepTemp("b", now-3600, nonce) // exactly an hour: kept
	legacy := "c:rebuild:" + strconv.FormatInt(now-7200, 10)
	lock := "d:rebuild-lock"
	noGlob := "e:rebuilt:1" // outside the default pattern
	for _, k := range []string{oldest, atHour, legacy, lock, noGlob} {
		sweepSet(t, c, k, 0)
	}
	s := store.New(c, store.Options{Now: sweepClock()})

	t.Run("negative OlderThan", func(t *testing.T) {
		got, err := s.Sweep(redistest.Ctx(t), store.SweepOptions{OlderThan: -time.Second})
		var e *store.Error
		if !errors.As(err, &e) || !strings.Contains(err.Error(), "must not be negative") {
			t.Errorf("err = %v, want *store.Error saying OlderThan must not be negative", err)
		}
		if len(got) != 0 {
			t.Errorf("got %q, want nothing swept", got)
		}
		if !redistest.Exists(t, c, oldest) || !redistest.Exists(t, c, legacy) {
			t.Errorf("a refused sweep deleted keys")
		}
	})

	t.Run("defaults", func(t *testing.T) {
		// C3: the legacy shape is left alone unless asked for.
		sweepWant(t, "dry run", sweepRun(t, s, store.SweepOptions{DryRun: true}), []string{oldest})
		sweepWant(t, "sweep", sweepRun(t, s, store.SweepOptions{}), []string{oldest})
		sweepWant(t, "sweep with Legacy", sweepRun(t, s, store.SweepOptions{Legacy: true}), []string{legacy})
		n, err := c.Do(redistest.Ctx(t), c.B().Dbsize().Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if n != 3 {
			t.Errorf("DBSIZE = %d, want 3 (%s, %s, %s)", n, atHour, lock, noGlob)
		}
		for _, k := range []string{atHour, lock, noGlob} {
			if !redistest.Exists(t, c, k) {
				t.Errorf("%s was swept, want it kept", k)
			}
		}
	})

	// Many keys: SCAN pages and UNLINK chunks (C40) must not lose any, and
	// a key that SCAN returns twice (it may, while the keyspace rehashes)
	// is reported once.
	t.Run("many", func(t *testing.T) {
		const n = 2345
		var want []string
		cmds := make(rueidis.Commands, 0, n)
		for i := range n {
			k := fmt.Sprintf("many:%d:rebuild:%d:%016x", i, now-7200, i)
			want = append(want, k)
			cmds = append(cmds, c.B().Set().Key(k).Value("x").Build())
		}
		for _, r := range c.DoMulti(redistest.Ctx(t), cmds...) {
			if err := r.Error(); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Do(redistest.Ctx(t), c.B().ConfigResetstat().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		scans, unlinks, biggest := 0, 0, 0
		h := sweepHook{
			Hook: redistest.Hook{OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
				if cmd.Commands()[0] == "SCAN" {
					if scans++; scans == 2 {
						// Replay the first page: every key on it comes twice.
						return c.Do(ctx, c.B().Scan().Cursor(0).Match("many:*").Count(500).Build())
					}
				}
				return c.Do(ctx, cmd)
			}},
			onDoMulti: func(multi []rueidis.Completed) {
				for _, cmd := range multi {
					if args := cmd.Commands(); args[0] == "UNLINK" {
						unlinks++
						biggest = max(biggest, len(args)-1)
					}
				}
			},
		}
		s := store.New(rueidishook.WithHook(c, h), store.Options{Now: sweepClock()})
		// A dry run, so that the replayed page still holds its keys.
		got, err := s.Sweep(redistest.Ctx(t), store.SweepOptions{Pattern: "many:*", DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		if scans < 3 {
			t.Fatalf("%d SCAN calls: the first page was the last, so no page was replayed", scans)
		}
		if dup := sweepDuplicates(got); len(dup) > 0 {
			t.Errorf("%d keys reported twice, e.g. %q", len(dup), dup[0])
		}
		slices.Sort(got)
		sweepWant(t, "dry run", got, want)
		if unlinks != 0 {
			t.Errorf("the dry run sent %d UNLINKs", unlinks)
		}

		sweepWant(t, "sweep", sweepRun(t, s, store.SweepOptions{Pattern: "many:*"}), want)
		if unlinks < 2 || biggest > 500 {
			t.Errorf("%d UNLINKs of at most %d keys, want chunks of at most 500 keys", unlinks, biggest)
		}
		// C40: SCAN, never KEYS.
		stats := sweepCmdstats(t, c)
		if stats["keys"] != 0 || stats["scan"] != scans {
			t.Errorf("KEYS called %d times and SCAN %d; want 0 and %d", stats["keys"], stats["scan"], scans)
		}
		left, err := c.Do(redistest.Ctx(t), c.B().Keys().Pattern("many:*").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		if len(left) != 0 {
			t.Errorf("%d keys left after the sweep, want 0", len(left))
		}
	})
}

// TestSweepKeyShapes: temp keys that the Store itself names, for the three
// key kinds, are recognised and swept, and their lock (Store.LockKey)
// vetoes them: what ParseTempKey calls the base must be what LockKey derives
// from, on a cluster too (C38, C39, C5+).
func TestSweepKeyShapes(t *testing.T) {
	parent := redistest.Prefix(t)
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		// The cluster targets share tg.live's prefix; give each subtest
		// its own, so that its sweep pattern sees only its keys.
		live := redistest.Prefix(t) + strings.TrimPrefix(tg.live, parent)
		s := store.New(tg.client, store.Options{Now: sweepClock()})
		then := store.New(tg.client, store.Options{Now: func() time.Time { return sweepNow.Add(-2 * time.Hour) }})
		orphans := []string{then.NewTempKey(live), then.NewTempKey(live)}
		recent := s.NewTempKey(live)
		liveFields := map[string]string{"f": "live"}
		redistest.SeedHash(t, tg.other, live, liveFields)
		for _, k := range append(slices.Clone(orphans), recent) {
			redistest.SeedHash(t, tg.other, k, map[string]string{"f": "partial"})
		}
		for _, k := range orphans {
			base, _, ok := store.ParseTempKey(k)
			if !ok || base+":rebuild-lock" != s.LockKey(live) {
				t.Fatalf("ParseTempKey(%q) = base %q, %v: its lock %q is not LockKey(%q) = %q",
					k, base, ok, base+":rebuild-lock", live, s.LockKey(live))
			}
		}
		opts := store.SweepOptions{Pattern: sweepPattern(t), OlderThan: time.Hour}

		// The rebuild's lock vetoes its orphans.
		lock, err := s.Acquire(ctx, live, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		sweepWant(t, "while locked", sweepRun(t, s, opts), nil)
		for _, k := range append(slices.Clone(orphans), recent) {
			if !redistest.Exists(t, tg.other, k) {
				t.Errorf("%s was swept while %s is held", k, lock.Key)
			}
		}
		redistest.WantString(t, tg.other, lock.Key, lock.Token)
		redistest.WantTTL(t, tg.other, lock.Key, 60*time.Second)

		if err := s.Release(ctx, lock); err != nil {
			t.Fatal(err)
		}
		sweepWant(t, "unlocked", sweepRun(t, s, opts), orphans)
		for _, k := range orphans {
			redistest.WantAbsent(t, tg.other, k)
		}
		if !redistest.Exists(t, tg.other, recent) {
			t.Errorf("recent temp key %s was swept", recent)
		}
		redistest.WantHash(t, tg.other, live, liveFields)
	})
}

// TestSweepAllMasters: orphans on all three masters are found and deleted
// through the one cluster client; none is missed and none is reported twice
// (C40).
func TestSweepAllMasters(t *testing.T) {
	t.Parallel()
	c, other := env.Cluster.Client(t), env.Cluster.Client(t)
	p := redistest.Prefix(t)
	old := sweepCutoff - 1
	perNode := map[string][]string{}
	var want []string
	for i := 0; len(want) < 6; i++ { // two keys on each of the three masters
		if i > 200 {
			t.Fatalf("200 keys landed on only %d nodes", len(perNode))
		}
		k := sweepTemp(p+"n"+strconv.Itoa(i), old, fmt.Sprintf("%016x", i))
		addr := env.Cluster.NodeFor(t, k).Addr
		if len(perNode[addr]) >= 2 {
			continue
		}
		perNode[addr] = append(perNode[addr], k)
		want = append(want, k)
		sweepSet(t, other, k, 0)
	}
	if len(perNode) != 3 {
		t.Fatalf("keys on %d nodes, want 3", len(perNode))
	}
	// The keys really are where NodeFor says: each node holds its own.
	for _, n := range env.Cluster.Nodes {
		nc := n.Client(t)
		for _, k := range perNode[n.Addr] {
			if !redistest.Exists(t, nc, k) {
				t.Errorf("%s is not on %s", k, n.Addr)
			}
		}
	}

	s := store.New(c, store.Options{Now: sweepClock()})
	got, err := s.Sweep(redistest.Ctx(t), store.SweepOptions{Pattern: sweepPattern(t), OlderThan: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if dup := sweepDuplicates(got); len(dup) > 0 {
		t.Errorf("keys reported more than once: %q", dup)
	}
	slices.Sort(got)
	sweepWant(t, "sweep", got, want)
	for _, k := range want {
		redistest.WantAbsent(t, other, k)
	}
}

// sweepDuplicates returns the keys that occur more than once in ks.
func sweepDuplicates(ks []string) []string {
	seen := map[string]int{}
	var dup []string
	for _, k := range ks {
		if seen[k]++; seen[k] == 2 {
			dup = append(dup, k)
		}
	}
	return dup
}

// TestSweepSkipsReplica: Sweep scans masters only (C40). The replica is
// writable here, so a key written to it alone exists nowhere else: a sweep
// that scanned the replica would report it.
func TestSweepSkipsReplica(t *testing.T) {
	t.Parallel()
	// No diskless-sync delay: the replica syncs at once.
	primary := redistest.OwnServer(t, "--repl-diskless-sync-delay", "0")
	replica := redistest.OwnServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port), "--replica-read-only", "no")
	pc, rc := primary.Client(t), replica.Client(t)
	ctx := redistest.Ctx(t)

	old := sweepCutoff - 1
	shared := sweepTemp("shared", old, "000000000000000a")
	only := sweepTemp("replica-only", old, "000000000000000b")
	sweepSet(t, pc, shared, 0)
	sweepPoll(t, "the replica to sync "+shared, func() bool { return redistest.Exists(t, rc, shared) })
	sweepSet(t, rc, only, 0)

	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:    []string{primary.Addr},
		DisableCache:   true,
		Standalone:     rueidis.StandaloneOption{ReplicaAddress: []string{replica.Addr}},
		SendToReplicas: func(rueidis.Completed) bool { return false },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	if n := len(client.Nodes()); n != 2 {
		t.Fatalf("client has %d nodes, want 2 (primary and replica)", n)
	}
	if err := rc.Do(ctx, rc.B().ConfigResetstat().Build()).Error(); err != nil {
		t.Fatal(err)
	}

	s := store.New(client, store.Options{Now: sweepClock()})
	sweepWant(t, "sweep", sweepRun(t, s, store.SweepOptions{}), []string{shared})
	redistest.WantAbsent(t, pc, shared)
	if !redistest.Exists(t, rc, only) {
		t.Errorf("%s was deleted from the replica", only)
	}
	info, err := rc.Do(ctx, rc.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(info, "cmdstat_scan:") {
		t.Errorf("the replica was scanned:\n%s", info)
	}
	if !strings.Contains(info, "cmdstat_role:") {
		t.Errorf("the replica was not asked its ROLE; the test proves nothing:\n%s", info)
	}
}

// TestSweepNodeWithoutRole: a node that cannot answer ROLE (a server where
// it is renamed or disabled, or one that lacks the command) counts as a
// master and is scanned.
func TestSweepNodeWithoutRole(t *testing.T) {
	t.Parallel()
	srv := redistest.OwnServer(t, "--rename-command", "ROLE", "")
	client := srv.Client(t)
	if err := client.Do(redistest.Ctx(t), client.B().Role().Build()).Error(); err == nil {
		t.Fatal("ROLE answered on a server started with it disabled; this test no longer covers a node that cannot")
	}

	orphan := sweepTemp("idx", sweepCutoff-1, "0123456789abcdef")
	recent := sweepTemp("idx", sweepNow.Unix(), "0123456789abcdef")
	sweepSet(t, client, orphan, 0)
	sweepSet(t, client, recent, 0)
	s := store.New(client, store.Options{Now: sweepClock()})
	sweepWant(t, "sweep", sweepRun(t, s, store.SweepOptions{}), []string{orphan})
	if got, want := redistest.Keys(t, client, "idx:"), []string{recent}; !slices.Equal(got, want) {
		t.Errorf("keys left: got %q, want %q", got, want)
	}
}

// sweepPoll waits until cond holds, for at most 10 s.
func sweepPoll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// sweepCmdstats returns the calls per command from INFO commandstats.
func sweepCmdstats(t *testing.T, c rueidis.Client) map[string]int {
	t.Helper()
	info, err := c.Do(redistest.Ctx(t), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	stats := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^cmdstat_([a-z|]+):calls=([0-9]+)`).FindAllStringSubmatch(info, -1) {
		stats[m[1]], _ = strconv.Atoi(m[2])
	}
	return stats
}

// sweepHook intercepts DoMulti, where the sweep batches its EXISTS (lock)
// and TTL checks.
type sweepHook struct {
	redistest.Hook
	onDoMulti func(multi []rueidis.Completed)
}

func (h sweepHook) DoMulti(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	h.onDoMulti(multi)
	return c.DoMulti(ctx, multi...)
}

// TestSweepRaces: the state can change between SCAN and each check; the
// sweep reports only what it really deletes (C39): not a key that vanished
// before its TTL check, nor one whose lock appeared before the lock check,
// nor one that got a TTL before the TTL check.
func TestSweepRaces(t *testing.T) {
	for _, tg := range sweepDeployments(t) {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			p := redistest.Prefix(t)
			old := sweepCutoff - 1
			orphan := sweepTemp(p+"orphan", old, "000000000000000a")
			vanished := sweepTemp(p+"vanished", old, "000000000000000b")
			locked := sweepTemp(p+"locked", old, "000000000000000c")
			touched := sweepTemp(p+"touched", old, "000000000000000d")
			for _, k := range []string{orphan, vanished, locked, touched} {
				sweepSet(t, tg.other, k, 0)
			}
			redistest.Cmd(t, tg.other, "DEL", p+"locked:rebuild-lock") // left by a previous -count run
			var once [2]sync.Once
			h := sweepHook{onDoMulti: func(multi []rueidis.Completed) {
				if len(multi) == 0 {
					return
				}
				switch multi[0].Commands()[0] {
				case "EXISTS": // the lock check: a rebuild starts, a key vanishes
					once[0].Do(func() {
						redistest.Cmd(t, tg.other, "SET", p+"locked:rebuild-lock", "successor", "EX", "600")
						redistest.Cmd(t, tg.other, "DEL", vanished)
					})
				case "TTL": // the TTL check: a rebuild touches its temp key
					once[1].Do(func() { redistest.Cmd(t, tg.other, "EXPIRE", touched, "600") })
				}
			}}
			s := store.New(rueidishook.WithHook(tg.client, h), store.Options{Now: sweepClock()})
			sweepWant(t, "sweep", sweepRun(t, s, store.SweepOptions{Pattern: sweepPattern(t), OlderThan: time.Hour}), []string{orphan})
			redistest.WantAbsent(t, tg.other, orphan)
			redistest.WantAbsent(t, tg.other, vanished)
			if !redistest.Exists(t, tg.other, locked) {
				t.Errorf("%s swept although its lock appeared before the lock check", locked)
			}
			redistest.WantString(t, tg.other, p+"locked:rebuild-lock", "successor")
			redistest.WantTTL(t, tg.other, touched, 600*time.Second)
		})
	}
}

// TestSweepDocumentsRollingUpgrade: C41 is a documentation rule: Sweep's
// doc comment must warn that it is unsafe during a rolling upgrade from
// lock-less versions (whose running rebuilds look exactly like the orphans
// TestSweep deletes: old, TTL-less, unlocked).
func TestSweepDocumentsRollingUpgrade(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var doc string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "Sweep" && fn.Recv != nil && fn.Doc != nil {
				doc = fn.Doc.Text()
			}
		}
	}
	if doc == "" {
		t.Fatal("found no doc comment on Store.Sweep")
	}
	for _, want := range []string{"rolling upgrade", "lock"} {
		if !strings.Contains(doc, want) {
			t.Errorf("Store.Sweep's doc does not mention %q:\n%s", want, doc)
		}
	}
}

// TestSweepFamilyLockStoreShapes: the same veto with the keys the Store
// itself derives. On a cluster a SetIndex prefix must carry a hash tag
// (builders.SetIndex), so its buckets are tagged too; the family's lock,
// Store.LockKey(prefix), must still be found from a bucket's temp key
// (C38 (2), C5+).
func TestSweepFamilyLockStoreShapes(t *testing.T) {
	for _, tg := range sweepDeployments(t) {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t)
			prefix := redistest.Prefix(t) + "{fam}:by-country"
			then := store.New(tg.client, store.Options{Now: func() time.Time { return sweepNow.Add(-2 * time.Hour) }})
			s := store.New(tg.client, store.Options{Now: sweepClock()})
			var orphans []string
			for _, b := range []string{"us", "de", "fr:paris"} {
				k := then.NewTempKey(prefix + ":" + b)
				orphans = append(orphans, k)
				redistest.Cmd(t, tg.other, "SADD", k, "member")
			}
			lock, err := s.Acquire(ctx, prefix, 60*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			opts := store.SweepOptions{Pattern: sweepPattern(t), OlderThan: time.Hour}
			sweepWant(t, "with the family lock "+lock.Key, sweepRun(t, s, opts), nil)
			for _, k := range orphans {
				if !redistest.Exists(t, tg.other, k) {
					t.Errorf("%s was swept while %s is held", k, lock.Key)
				}
			}
			if err := s.Release(ctx, lock); err != nil {
				t.Fatal(err)
			}
			sweepWant(t, "without it", sweepRun(t, s, opts), orphans)
			for _, k := range orphans {
				redistest.WantAbsent(t, tg.other, k)
			}
		})
	}
}
