package reliability

// Trust (RELIABILITY.md, "Trust"): what each Redis user may write, and what
// a user with exactly those rights can and cannot break; and a log of
// changes evicted under memory pressure. The users are those of the
// README's rights table: the rebuild user (minimalCommands), the Apply
// user (redistest.ApplyCommands) and the operator (operatorRules).

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
)

// operatorRules are the ACL rules of an operator of the runs under prefix,
// who runs keyswap's control commands (cancel, throttle, pause, resume,
// publish, discard) and status: the read commands on every key of the
// prefix (%R~), EVAL and EVALSHA on the keys next to the locks (Redis
// checks a script's declared keys for write access, whatever the script
// does with them), and the writes of the control script only on the runs'
// requests ("<lock>:ctl"). Redis checks every command a script sends as
// well: the control script reads the lock, the record and the receipt, and
// writes the requests. No selector lets the user write a record.
func operatorRules(prefix string) []string {
	return []string{"%R~" + prefix + "*",
		"+get", "+hget", "+hgetall", "+pttl", "+ttl", "+type", "+scan", "+ping",
		"(~" + prefix + "*:rebuild-lock* +eval +evalsha)",
		"(~" + prefix + "*:rebuild-lock:ctl +hset +del +pexpire)"}
}

// changeAll returns the changes of app that write every command the
// builders of the online indexes emit: a delete (HDELIF, ZREMIF, SREM)
// and an insert (HSET, ZADD, SADD).
func changeAll(u fuser, tag string, n int) []rebuild.Change[fuser] {
	fresh := fuser{ID: fmt.Sprintf("%s-new%d", tag, n), Email: fmt.Sprintf("%s-new%d@example.com", tag, n), Country: "c01", Score: float64(n)}
	return []rebuild.Change[fuser]{rebuild.Delete(u), rebuild.Insert(fresh)}
}

func TestTrustApplyUserRights(t *testing.T) {
	// C75: a user with exactly redistest.ApplyCommands applies changes, with no run
	// in progress and during one, which replays them: the indexes equal
	// the source of truth. A user without any one of them is refused
	// before anything is written (ErrNoPermission naming the command):
	// every one is needed.
	t.Parallel()
	ctx := redistest.Ctx(t)
	srv := redistest.OwnServer(t)
	admin := srv.Client(t)
	p := redistest.Prefix(t)
	k := newOnlineKeys(p + "idx:")
	seedOnline(t, admin, k, 200, "a")
	user := srv.ClientAs(t, "ks-apply", redistest.ApplyRules(p+"idx:*")...)
	app, err := newOnlineApp(ctx, admin, k.rebuilder(t, user, rebuild.Options{}), k.db, "a", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Steps(ctx, 50); err != nil {
		t.Fatalf("Apply with no run: %v", err)
	}
	hold := newHeldSource()
	done := make(chan error, 1)
	go func() {
		_, err := k.rebuilder(t, admin, rebuild.Options{}).Run(ctx, truthSource(admin, k.db, hold))
		done <- err
	}()
	<-hold.read
	if err := app.Steps(ctx, 100); err != nil {
		t.Errorf("Apply during a run: %v", err)
	}
	close(hold.release)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	wantOnline(t, admin, k)

	// The run's lock is held (by the admin, with a record) for the
	// refusals below, so that every right of the script is checked.
	hold = newHeldSource()
	go func() {
		_, err := k.rebuilder(t, admin, rebuild.Options{}).Run(ctx, truthSource(admin, k.db, hold))
		done <- err
	}()
	<-hold.read
	for i, cmd := range redistest.ApplyCommands {
		if cmd == "eval" || cmd == "evalsha" {
			continue // refused by the server itself, before the script runs: TestACLMissingRight
		}
		c := srv.ClientAs(t, "ks-apply-without-"+cmd, redistest.ApplyRules(p+"idx:*", cmd)...)
		before := appliedState(t, admin, k)
		u := app.Users[app.IDs[i]]
		err := k.rebuilder(t, c, rebuild.Options{}).Apply(ctx, changeAll(u, "w", i)...)
		if !errors.Is(err, rebuild.ErrNoPermission) || !strings.Contains(err.Error(), strings.ToUpper(cmd)) {
			t.Errorf("without +%s: Apply = %v, want ErrNoPermission naming %s", cmd, err, strings.ToUpper(cmd))
		}
		if diff := cmp.Diff(before, appliedState(t, admin, k)); diff != "" {
			t.Errorf("without +%s: what Apply writes changed (-before +after):\n%s", cmd, diff)
		}
	}
	close(hold.release)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	wantOnline(t, admin, k)
	redistest.WantClean(t, admin, p)
}

func TestTrustOldMinimalRules(t *testing.T) {
	// C57: a user with exactly the rights the README listed before (the
	// rebuild user's minimal rules, without ZREM, ZSCORE and SREM, which
	// the catch-up and the publish send to replay changes, and without
	// PEXPIRE, which KeepPrevious needs) fails at the acquire, naming the
	// command, before any batch is written; not after the whole build, at
	// the catch-up (with a NOPERM that did not match ErrNoPermission) or at
	// the publish. The live keys are as they were.
	t.Parallel()
	for _, tc := range []struct {
		name    string
		without []string
		opts    rebuild.Options
		names   string // the command the error names
	}{
		{"changes applied during the run", []string{"zrem", "zscore", "srem"}, rebuild.Options{}, "ZREM"},
		{"KeepPrevious", []string{"pexpire"}, rebuild.Options{KeepPrevious: time.Hour}, "PEXPIRE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t)
			srv := redistest.OwnServer(t)
			admin := srv.Client(t)
			p := redistest.Prefix(t)
			k := newOnlineKeys(p)
			seedOnline(t, admin, k, 300, "a")
			before := redistest.Snapshot(t, admin, p)
			c := srv.ClientAs(t, "ks-old-minimal", minimalRules("~ks:*", tc.without...)...)
			app, err := newOnlineApp(ctx, admin, k.rebuilder(t, admin, rebuild.Options{}), k.db, "a", 2)
			if err != nil {
				t.Fatal(err)
			}
			// The source applies changes as it starts: logged for the
			// run, then replayed by its catch-up.
			truth := truthSource(admin, k.db, nil)
			stats, err := k.rebuilder(t, c, tc.opts).Run(ctx, func(ctx context.Context) iter.Seq2[fuser, error] {
				if err := app.Steps(ctx, 50); err != nil {
					t.Errorf("Apply: %v", err)
				}
				return truth(ctx)
			})
			t.Logf("Run after %d batches: %v", stats.Batches, err)
			if !errors.Is(err, rebuild.ErrNoPermission) || !strings.Contains(err.Error(), tc.names) {
				t.Errorf("Run: got %v, want ErrNoPermission naming %s", err, tc.names)
			}
			var e *rebuild.Error
			if !errors.As(err, &e) || e.Op != "acquire" || stats.Batches != 0 {
				t.Errorf("Run: got %v after %d batches, want the acquire's refusal before any batch", err, stats.Batches)
			}
			redistest.WantUnchanged(t, admin, p, before)
		})
	}
}

func TestTrustOperatorRights(t *testing.T) {
	// C74: an operator with operatorRules throttles and cancels a run with
	// the CLI; the same user may not write the run's record: overwriting
	// its token (which would turn off the logging of changes) is refused
	// by Redis (NOPERM). The run is aborted, the live keys as they were.
	t.Parallel()
	ctx := redistest.Ctx(t)
	bin := buildCLI(t)
	srv := redistest.OwnServer(t)
	admin := srv.Client(t)
	p := redistest.Prefix(t)
	k := newOnlineKeys(p)
	seedOnline(t, admin, k, 300, "a")
	before := redistest.Snapshot(t, admin, p)
	const name = "ks-operator"
	op := srv.ClientAs(t, name, operatorRules(p)...)
	redistest.Do(t, admin, admin.B().AclSetuser().Username(name).Rule(">"+aclPassword).Build())
	a := &aclCase{tb: t, admin: admin, user: op, name: name, pw: aclPassword, addrs: []string{srv.Addr}, prefix: p, bin: bin}

	hold := newHeldSource()
	done := make(chan error, 1)
	go func() {
		_, err := k.rebuilder(t, admin, rebuild.Options{}).Run(ctx, truthSource(admin, k.db, hold))
		done <- err
	}()
	<-hold.read
	lock := keys.LockKey(k.email, false)
	for _, args := range [][]string{{"throttle", k.email, "5"}, {"status", "-json", p + "*"}} {
		code, stdout, stderr, err := a.cli(ctx, args...)
		if err != nil || code != 0 && !(args[0] == "status" && code == 3) {
			t.Errorf("keyswap %s: exit %d, %v; stdout %q, stderr %q", strings.Join(args, " "), code, err, stdout, stderr)
		}
	}
	if ctl := redistest.HGetAll(t, admin, keys.CtlKey(lock)); ctl["max_rate"] != "5" {
		t.Errorf("the run's requests: %q, want max_rate 5", ctl)
	}
	err := op.Do(ctx, op.B().Hset().Key(keys.RecordKey(lock)).FieldValue().FieldValue("token", "forged").Build()).Error()
	if !isNoPerm(err) {
		t.Errorf("HSET on the record as the operator: %v, want NOPERM", err)
	}
	code, stdout, stderr, err := a.cli(ctx, "cancel", k.country)
	if err != nil || code != 0 {
		t.Errorf("keyswap cancel: exit %d, %v; stdout %q, stderr %q", code, err, stdout, stderr)
	}
	close(hold.release)
	if err := <-done; !errors.Is(err, rebuild.ErrAborted) {
		t.Errorf("Run: got %v, want ErrAborted", err)
	}
	redistest.WantUnchanged(t, admin, p, before)
}

// usedMemory returns the server's used_memory.
func usedMemory(t *testing.T, c rueidis.Client) int64 {
	t.Helper()
	return infoField(t, c, "memory", "used_memory")
}

// infoField returns field of INFO section as an integer.
func infoField(t *testing.T, c rueidis.Client, section, field string) int64 {
	t.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section(section).Build()).ToString()
	if err != nil {
		t.Fatalf("INFO %s: %v", section, err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s: %s %q: %v", section, field, v, err)
			}
			return n
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return 0
}

func TestTrustLogEvicted(t *testing.T) {
	// C73: under maxmemory-policy volatile-random, the logs of changes grow
	// until Redis evicts keys with a TTL: the run's logs, locks and records,
	// at random. Whichever go, the run fails closed (a log shorter than its
	// count: ErrWritesLost; a record gone: ErrWritesLost; a lock gone:
	// ErrLockLost), and the live keys, which have no TTL, hold every
	// change. Before, a run that lost only a log published the index
	// without its changes. Each round is a run of its own; eviction is
	// random, so there are several.
	t.Parallel()
	ctx := redistest.Ctx(t)
	srv := redistest.OwnServer(t)
	admin := srv.Client(t)
	p := redistest.Prefix(t)
	k := newOnlineKeys(p)
	seedOnline(t, admin, k, 500, "a")
	app, err := newOnlineApp(ctx, admin, k.rebuilder(t, admin, rebuild.Options{}), k.db, "a", 3)
	if err != nil {
		t.Fatal(err)
	}
	config := func(maxmemory int64, policy string) {
		t.Helper()
		redistest.Do(t, admin, admin.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", policy).
			ParameterValue("maxmemory", strconv.FormatInt(maxmemory, 10)).Build())
	}
	defer config(0, "noeviction")
	rng := rand.New(rand.NewPCG(3, 3))
	const rounds = 6
	var failures []string
	for round := range rounds {
		hold := newHeldSource()
		done := make(chan error, 1)
		go func() {
			_, err := k.rebuilder(t, admin, rebuild.Options{}).Run(ctx, truthSource(admin, k.db, hold))
			done <- err
		}()
		<-hold.read
		evicted := infoField(t, admin, "stats", "evicted_keys")
		config(usedMemory(t, admin)+256<<10, "volatile-random")
		// Updates whose emails are long, so that the logs grow fast. A
		// change Apply refuses (a lock held by a run whose record is gone)
		// is applied again once the run has ended.
		var pending []rebuild.Change[fuser]
		for i := 0; infoField(t, admin, "stats", "evicted_keys") == evicted && i < 100_000; i++ {
			old := app.Users[app.IDs[rng.IntN(len(app.IDs))]]
			u := old
			u.Email = fmt.Sprintf("%s.%d.%s@example.com", u.ID, i, strings.Repeat("x", 200))
			if err := admin.Do(ctx, admin.B().Hset().Key(k.db).FieldValue().FieldValue(u.ID, redistest.EncodeUser(u)).Build()).Error(); err != nil {
				t.Fatalf("committing a change: %v", err)
			}
			app.Users[u.ID] = u
			if err := app.Rebuilder.Apply(ctx, rebuild.Update(old, u)); err != nil {
				pending = append(pending, rebuild.Update(old, u))
			}
		}
		config(0, "noeviction")
		close(hold.release)
		runErr := <-done
		for _, c := range pending {
			if err := app.Rebuilder.Apply(ctx, c); err != nil {
				t.Fatalf("round %d: Apply once the run ended: %v", round, err)
			}
		}
		t.Logf("round %d: %d keys evicted; Run: %v", round, infoField(t, admin, "stats", "evicted_keys")-evicted, runErr)
		if runErr == nil {
			failures = append(failures, fmt.Sprintf("round %d: Run published although keys of the run were evicted", round))
		}
		if lost, stale := wantOnline(t, admin, k); lost+stale > 0 {
			failures = append(failures, fmt.Sprintf("round %d: %d lost, %d stale", round, lost, stale))
		}
		redistest.WantClean(t, admin, p)
	}
	for _, f := range failures {
		t.Error(f)
	}
}

// appliedState returns what an Apply of k's indexes writes while a run holds
// their locks: the index keys, each lock's log, and the counters of each
// lock's record. (Not the whole record, nor the locks' TTLs: the run's
// heartbeats rewrite its status and renew them every second.)
func appliedState(t *testing.T, c rueidis.Client, k onlineKeys) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, prefix := range []string{k.email, k.score, k.country} {
		for key, st := range redistest.Snapshot(t, c, prefix) {
			if !strings.Contains(key, keys.LockSuffix) {
				out[key] = st.Dump
			}
		}
	}
	for _, lock := range k.locks(c.Mode() == rueidis.ClientModeCluster) {
		log, record := keys.LogKey(lock), keys.RecordKey(lock)
		entries, err := redistest.Do(t, c, c.B().Lrange().Key(log).Start(0).Stop(-1).Build()).AsStrSlice()
		if err != nil {
			t.Fatalf("LRANGE %s: %v", log, err)
		}
		out[log] = strings.Join(entries, "\n")
		for _, f := range []string{"logged", "work"} {
			v, err := c.Do(redistest.Ctx(t), c.B().Hget().Key(record).Field(f).Build()).ToString()
			if err != nil && !rueidis.IsRedisNil(err) {
				t.Fatalf("HGET %s %s: %v", record, f, err)
			}
			out[record+" "+f] = v
		}
	}
	return out
}
