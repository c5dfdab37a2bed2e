package reliability

// Missing rights (RELIABILITY.md, "Production conditions"): ACL users that
// lack one command keyswap needs, a command disabled with rename-command, a
// right revoked mid-run, and the minimal rules that let every part of
// keyswap work.
//
// The old code (d86fdeb) checked no right before writing: its publish
// script UNLINKed the live key, then RENAMEd the temp key over it, then
// PERSISTed it, and Redis does not roll a script back. A user without
// RENAME lost the live key (UNLINKed, nothing renamed over it); one without
// PERSIST got the new value with the temp key's TTL, so the index expired
// minutes later; one without UNLINK, EVAL or EVALSHA left its lock or temp
// keys behind until their TTL. The assertions that the live key is
// byte-identical, without a TTL, with nothing beside it, fail on each.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// isNoPerm reports whether err holds Redis's own ACL refusal.
func isNoPerm(err error) bool {
	var re *rueidis.RedisError
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "NOPERM")
}

// TestACLMissingRight runs the rebuild as a user that lacks one right, or
// on a server where RENAME is disabled, each on a server of its own, whose
// script cache is empty: rueidis sends every script with EVALSHA first and
// falls back to EVAL on NOSCRIPT. The run must fail with an error that
// names the command, and leave the live hash byte-identical, without a TTL,
// with no key beside it.
func TestACLMissingRight(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		deny    string   // the right the user lacks ("": the default user)
		args    []string // the server's arguments
		command string   // what the error must name
		// keyswap: the refusal is keyswap's own check (ErrNoPermission),
		// found by the acquire script before anything is written; else
		// it is the server's NOPERM for the script command itself.
		keyswap bool
	}{
		{name: "RENAME", deny: "-rename", command: "RENAME", keyswap: true},
		{name: "PERSIST", deny: "-persist", command: "PERSIST", keyswap: true},
		{name: "UNLINK", deny: "-unlink", command: "UNLINK", keyswap: true},
		{name: "EVAL", deny: "-eval", command: "'eval'"},
		{name: "EVALSHA", deny: "-evalsha", command: "'evalsha'"},
		{name: "RENAME disabled", args: []string{"--rename-command", "RENAME", ""}, command: "RENAME", keyswap: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t)
			srv := redistest.OwnServer(t, tc.args...)
			admin := srv.Client(t)
			prefix := redistest.Prefix(t)
			live := prefix + "by-email"
			redistest.SeedHash(t, admin, live, prodOld)
			before := redistest.Snapshot(t, admin, prefix)
			c := admin
			if tc.deny != "" {
				c = srv.ClientAs(t, "ks-"+tc.name, "~ks:*", "+@all", tc.deny)
			}
			r := redistest.Rebuilder(t, c, prodOptions(), prodHash(live))
			stats, err := r.Run(ctx, prodItems())
			t.Logf("Run: %v", err)
			if err == nil {
				t.Fatal("Run: nil, want an error")
			}
			if !strings.Contains(err.Error(), tc.command) {
				t.Errorf("err = %q, want it to name %s", err, tc.command)
			}
			if got := errors.Is(err, rebuild.ErrNoPermission); got != tc.keyswap {
				t.Errorf("errors.Is(err, ErrNoPermission) = %v, want %v", got, tc.keyswap)
			}
			if !tc.keyswap && !isNoPerm(err) {
				t.Errorf("err = %v, want the server's NOPERM", err)
			}
			if stats.Batches != 0 {
				t.Errorf("Stats.Batches = %d, want 0: refused before the first batch", stats.Batches)
			}
			redistest.WantHash(t, admin, live, prodOld)
			redistest.WantUnchanged(t, admin, prefix, before)
			wantKeys(t, admin, prefix, live)
		})
	}
}

// TestACLMissingEvalScriptsCached runs as a user without EVAL on a server
// whose script cache already holds keyswap's scripts (loaded by another
// user's run), so that EVALSHA alone would do, and flushes the cache after
// batch 2: every script then needs EVAL once, which the user may not run.
// The builder is not Incremental (builders.Func): no change is ever
// replayed, so the acquire does not ask for EVAL, which the catch-up sends
// for a conditional removal (a user without it and an Incremental builder
// is refused at the acquire: TestScriptAcquireRefused).
// The publish never runs (NOPERM for EVAL), the live hash is untouched, and
// what the failed cleanup leaves is bounded: the temp key is kept for
// PreserveFor (the publish script itself failed), and the lock and the run
// record, which the release script could not delete, expire within the
// lease. (+eval is in minimalCommands for this.)
func TestACLMissingEvalScriptsCached(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t)
	srv := redistest.OwnServer(t)
	admin := srv.Client(t)
	prefix := redistest.Prefix(t)
	live := prefix + "by-email"
	// The admin's run loads every script a run sends.
	warm := redistest.Rebuilder(t, admin, prodOptions(), prodHash(prefix+"warm"))
	if _, err := warm.Run(ctx, prodItems()); err != nil {
		t.Fatalf("the admin's run: %v", err)
	}
	redistest.Cmd(t, admin, "DEL", prefix+"warm", keys.MetaKey(prefix+"warm", false))
	redistest.SeedHash(t, admin, live, prodOld)
	before := redistest.Snapshot(t, admin, prefix)
	c := srv.ClientAs(t, "ks-no-eval", "~ks:*", "+@all", "-eval")
	hooked := onBatch(c, func(n int, _ string) {
		if n == 2 {
			if err := admin.Do(ctx, admin.B().ScriptFlush().Build()).Error(); err != nil {
				t.Errorf("SCRIPT FLUSH: %v", err)
			}
		}
	})
	const ttl, preserve = 10 * time.Second, 30 * time.Second
	o := prodOptions()
	o.TTL, o.PreserveFor = ttl, preserve
	r := redistest.Rebuilder(t, hooked, o, prodFuncHash(live))
	stats, err := r.Run(ctx, prodItems())
	t.Logf("Run after %d batches: %v", stats.Batches, err)
	if err == nil {
		t.Fatal("Run: nil, want an error")
	}
	if !isNoPerm(err) || !strings.Contains(err.Error(), "'eval'") {
		t.Errorf("err = %v, want the server's NOPERM for eval", err)
	}
	redistest.WantHash(t, admin, live, prodOld)
	if diff := cmp.Diff(before[live], redistest.Snapshot(t, admin, prefix)[live]); diff != "" {
		t.Errorf("%s changed (-before +after):\n%s", live, diff)
	}
	lock := keys.LockKey(live, false)
	left := leftovers(t, admin, prefix)
	t.Logf("left behind, with TTLs: %v", left)
	for _, l := range left {
		bound := ttl
		if _, _, temp := store.ParseTempKey(l.key); temp {
			bound = preserve
		} else if l.key != lock && l.key != keys.RecordKey(lock) {
			t.Errorf("left behind: %s (PTTL %v), want only the temp key, the lock and the record", l.key, l.pttl)
			continue
		}
		if l.pttl <= 0 || l.pttl > bound {
			t.Errorf("%s: PTTL %v, want in (0, %v]", l.key, l.pttl, bound)
		}
	}
}

// prodFuncHash is prodHash as a builders.Func: the same hash, from a
// builder that cannot apply changes (not Incremental).
func prodFuncHash(live string) index.Builder[int] {
	return builders.Func(live, func(c *index.Commands, items []int) error {
		temp, err := c.Temp(live)
		if err != nil {
			return err
		}
		cmd := c.B().Hset().Key(temp).FieldValue()
		for _, i := range items {
			cmd = cmd.FieldValue("f"+strconv.Itoa(i), "new-"+strconv.Itoa(i))
		}
		c.Add(cmd.Build(), len(items))
		return nil
	})
}

// TestACLRevokedMidRun takes RENAME away from the run's user after batch
// 2, from an admin client: the batches go on (they need no RENAME), and
// the publish script's own check refuses before its first write, with
// ErrNoPermission, where the old code (d86fdeb) UNLINKed the live hash and
// then failed on RENAME: the index was gone. The run's temp key is
// discarded and its locks released (UNLINK, DEL and the scripts are still
// allowed), so nothing is left.
func TestACLRevokedMidRun(t *testing.T) {
	t.Parallel()
	ctx := redistest.Ctx(t)
	srv := redistest.OwnServer(t)
	admin := srv.Client(t)
	prefix := redistest.Prefix(t)
	live := prefix + "by-email"
	redistest.SeedHash(t, admin, live, prodOld)
	before := redistest.Snapshot(t, admin, prefix)
	const user = "ks-revoked"
	c := srv.ClientAs(t, user, "~ks:*", "+@all")
	hooked := onBatch(c, func(n int, _ string) {
		if n == 2 {
			if err := admin.Do(ctx, admin.B().AclSetuser().Username(user).Rule("-rename").Build()).Error(); err != nil {
				t.Errorf("ACL SETUSER %s -rename: %v", user, err)
			}
		}
	})
	r := redistest.Rebuilder(t, hooked, prodOptions(), prodHash(live))
	stats, err := r.Run(ctx, prodItems())
	t.Logf("Run after %d batches: %v", stats.Batches, err)
	redistest.WantErr(t, err, rebuild.ErrNoPermission)
	if !strings.Contains(err.Error(), "RENAME") || errOp(err) != "publish" {
		t.Errorf("err = %q (op %q), want the publish's refusal of RENAME", err, errOp(err))
	}
	if stats.Batches != prodBatches {
		t.Errorf("Stats.Batches = %d, want %d: the batches need no RENAME", stats.Batches, prodBatches)
	}
	redistest.WantHash(t, admin, live, prodOld)
	redistest.WantUnchanged(t, admin, prefix, before)
	wantKeys(t, admin, prefix, live)
}

// minimalCommands are the commands a user needs, and no more, so that
// rebuild.Rebuilder.Run (with builders.Hash, builders.SortedSet and
// builders.SetIndex), store.Store.WithRebuild, store.Store.Sweep (dry run
// or not), and keyswap status and sweep (dry run or --delete) all work on a
// standalone server: with a key pattern that covers the live keys,
//
//	ACL SETUSER keyswap on >password ~ks:* -@all +eval +evalsha +multi +exec +get +set +del +exists +unlink +rename +persist +expire +ttl +pttl +type +hset +hget +hmget +hgetall +hdel +hincrby +llen +lrange +zadd +zrem +zscore +sadd +srem +scan
//
// On a cluster, add +cluster|slots, which a rueidis cluster client needs to
// find the slots. TestMinimalACL checks that a user with these rules runs
// every part, and that one without any of them fails some part.
var minimalCommands = []string{
	"eval", "evalsha", // every script; EVAL when the server's script cache lacks it
	"multi", "exec", // every batch is a transaction
	"get", "set", "del", "exists", "unlink", "rename", "persist", "expire", "ttl", "pttl", "type", // locks, receipts, publish, sweep, status
	"hset", "hget", "hmget", "hgetall", "hdel", "hincrby", // the run record, the generations, the heartbeat, status
	"llen", "lrange", // the run's log of changes: the heartbeat, the catch-up
	"zadd", "sadd", // builders.SortedSet and builders.SetIndex (builders.Hash: hset)
	"zrem", "zscore", "srem", // the changes the catch-up and the publish replay (HDELIF: hget, hdel)
	"scan", // a family's buckets, the sweep, status
}

// minimalRules returns the ACL rules of a user with minimalCommands but
// those in without, on the keys that pattern matches. ClientAs starts from
// "reset": no command, no key, no channel.
func minimalRules(pattern string, without ...string) []string {
	rules := []string{pattern}
	for _, c := range minimalCommands {
		if !slices.Contains(without, c) {
			rules = append(rules, "+"+c)
		}
	}
	return rules
}

// aclCase is one user of TestMinimalACL and the deployment it runs on.
type aclCase struct {
	tb      testing.TB
	admin   rueidis.Client // the default user, every right
	user    rueidis.Client // the user under test
	name    string         // the user's name, for the CLI
	pw      string         // a password of the user's, for the CLI
	addrs   []string       // the servers, for the CLI
	prefix  string         // every key of the case starts with it
	bin     string         // the keyswap command, built
	cluster bool
}

// aclStep is one part of keyswap that a user runs in TestMinimalACL.
type aclStep struct {
	name string
	run  func(ctx context.Context, a *aclCase) error
}

// aclSteps are the parts of keyswap TestMinimalACL runs, in order.
var aclSteps = []aclStep{
	{"Rebuilder.Run", stepRun},
	{"Store.WithRebuild", stepWithRebuild},
	{"Store.Sweep dry run", func(ctx context.Context, a *aclCase) error { return stepSweep(ctx, a, true) }},
	{"Store.Sweep", func(ctx context.Context, a *aclCase) error { return stepSweep(ctx, a, false) }},
	{"keyswap status", stepStatus},
	{"keyswap sweep", func(ctx context.Context, a *aclCase) error { return stepCLISweep(ctx, a, false) }},
	{"keyswap sweep --delete", func(ctx context.Context, a *aclCase) error { return stepCLISweep(ctx, a, true) }},
}

// renewals watches a run's client for a heartbeat and a temp-key refresh
// that succeeded: done is closed once both have.
type renewals struct {
	heartbeat, refresh atomic.Bool
	once               sync.Once
	done               chan struct{}
}

var heartbeatScript, refreshScript = redistest.ScriptNamed("heartbeat"), redistest.ScriptNamed("refresh")

// watch returns c with a hook that marks a successful heartbeat or refresh.
func (w *renewals) watch(c rueidis.Client) rueidis.Client {
	w.done = make(chan struct{})
	seen := func(args []string, res rueidis.RedisResult) {
		arr, err := res.ToArray()
		if err != nil || len(arr) == 0 {
			return
		}
		if code, err := arr[0].AsInt64(); err != nil || code != 1 {
			return
		}
		switch {
		case heartbeatScript.Is(args):
			w.heartbeat.Store(true)
		case refreshScript.Is(args):
			w.refresh.Store(true)
		default:
			return
		}
		if w.heartbeat.Load() && w.refresh.Load() {
			w.once.Do(func() { close(w.done) })
		}
	}
	return rueidishook.WithHook(c, redistest.Hook{
		OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			args := slices.Clone(cmd.Commands())
			res := c.Do(ctx, cmd)
			seen(args, res)
			return res
		},
		OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
			args := make([][]string, len(multi))
			for i, cmd := range multi {
				args[i] = slices.Clone(cmd.Commands())
			}
			res := c.DoMulti(ctx, multi...)
			for i, r := range res {
				seen(args[i], r)
			}
			return res
		},
	})
}

// pausedSource yields items, and halfway calls pause, which may block: a
// run that must live through renewals, or be seen running.
func pausedSource(items []fuser, pause func(ctx context.Context) error) sources.Source[fuser] {
	return func(ctx context.Context) iter.Seq2[fuser, error] {
		return func(yield func(fuser, error) bool) {
			for i, u := range items {
				if i == len(items)/2 {
					if err := pause(ctx); err != nil {
						yield(fuser{}, err)
						return
					}
				}
				if !yield(u, nil) {
					return
				}
			}
		}
	}
}

// aclRunTTL is the lease of the runs of TestMinimalACL: short, so that a
// heartbeat and a refresh (every TTL/3, at most a second) come soon.
const aclRunTTL = 3 * time.Second

// liveOf returns the live keys under prefix, as readLive does, without
// keyswap's own (the generations).
func liveOf(t testing.TB, c rueidis.Client, prefix string) map[string]content {
	got := readLive(t, c, prefix)
	for k := range got {
		if keys.Reserved(k) {
			delete(got, k)
		}
	}
	return got
}

// stepRun rebuilds a Hash, a SortedSet and a SetIndex twice: the second
// run replaces every key and moves the family's buckets, and lives until a
// heartbeat and a temp-key refresh have succeeded.
func stepRun(ctx context.Context, a *aclCase) error {
	s := newShape(a.prefix + "run:")
	for _, d := range []dataset{v1, v2} {
		var w renewals
		c := w.watch(a.user)
		pause := func(context.Context) error { return nil }
		if d == v2 {
			pause = func(ctx context.Context) error {
				select {
				case <-w.done:
					return nil
				case <-ctx.Done():
					return fmt.Errorf("renewals: heartbeat %v, refresh %v: %w", w.heartbeat.Load(), w.refresh.Load(), context.Cause(ctx))
				case <-time.After(faultWait):
					return fmt.Errorf("no heartbeat and refresh succeeded within %v (heartbeat %v, refresh %v)", faultWait, w.heartbeat.Load(), w.refresh.Load())
				}
			}
		}
		r, err := rebuild.New(c, rebuild.Options{BatchSize: 200, TTL: aclRunTTL}, s.builders()...)
		if err != nil {
			return err
		}
		if _, err := r.Run(ctx, pausedSource(d.items(), pause)); err != nil {
			return fmt.Errorf("run over the %v data: %w", d, err)
		}
		if ok, why := sameLive(liveOf(a.tb, a.admin, a.prefix+"run:"), s.expected(d)); !ok {
			return fmt.Errorf("after the run over the %v data: %s", d, why)
		}
	}
	return nil
}

// stepWithRebuild rebuilds a hash twice with WithRebuild, in three
// touched batches.
func stepWithRebuild(ctx context.Context, a *aclCase) error {
	live := a.prefix + "with-rebuild"
	st := store.New(a.user, store.Options{})
	for _, gen := range []string{"old", "new"} {
		want := redistest.Fields(gen, 300)
		err := st.WithRebuild(ctx, live, store.RebuildOptions{TTL: 10 * time.Second}, func(ctx context.Context, temp string, touch func(context.Context) error) error {
			for b := range 3 {
				cmd := a.user.B().Hset().Key(temp).FieldValue()
				for i := b * 100; i < (b+1)*100; i++ {
					f := "f" + fmt.Sprint(i)
					cmd = cmd.FieldValue(f, want[f])
				}
				if err := a.user.Do(ctx, cmd.Build()).Error(); err != nil {
					return err
				}
				if err := touch(ctx); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("WithRebuild %s: %w", gen, err)
		}
		got, err := a.admin.Do(ctx, a.admin.B().Hgetall().Key(live).Build()).AsStrMap()
		if err != nil {
			return err
		}
		if len(got) != len(want) || !mapsEqual(got, want) {
			return fmt.Errorf("after WithRebuild %s: %s has %d fields, want the %d of %s", gen, live, len(got), len(want), gen)
		}
	}
	return nil
}

func mapsEqual(a, b map[string]string) bool {
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return len(a) == len(b)
}

// orphan writes, as the admin, a temp key that the sweep must delete (no
// TTL, no lock, from 2001) and one it must keep (its rebuild holds the
// lock), and returns the first.
func (a *aclCase) orphan(ctx context.Context, name string) (string, error) {
	base := a.prefix + name
	doomed := base + ":rebuild:1000000000:0123456789abcdef"
	kept := base + "-locked:rebuild:1000000000:fedcba9876543210"
	lock := keys.LockKeyForBase(base + "-locked")
	for _, cmd := range []rueidis.Completed{
		a.admin.B().Set().Key(doomed).Value("x").Build(),
		a.admin.B().Set().Key(kept).Value("x").Build(),
		a.admin.B().Set().Key(lock).Value("someone").ExSeconds(60).Build(),
	} {
		if err := a.admin.Do(ctx, cmd).Error(); err != nil {
			return "", err
		}
	}
	return doomed, nil
}

// exists reports whether key exists, as the admin sees it.
func (a *aclCase) exists(ctx context.Context, key string) (bool, error) {
	n, err := a.admin.Do(ctx, a.admin.B().Exists().Key(key).Build()).AsInt64()
	return n == 1, err
}

// stepSweep sweeps the case's keys with Store.Sweep, with dryRun or not:
// the orphan is listed, and deleted unless dryRun; the locked temp key is
// kept.
func stepSweep(ctx context.Context, a *aclCase, dryRun bool) error {
	name := "store-delete" // no name is a prefix of another's: each sweep sees its own keys
	if dryRun {
		name = "store-dry"
	}
	doomed, err := a.orphan(ctx, name)
	if err != nil {
		return err
	}
	got, err := store.New(a.user, store.Options{}).Sweep(ctx, store.SweepOptions{Pattern: a.prefix + name + "*:rebuild:*", DryRun: dryRun})
	if err != nil {
		return err
	}
	if !slices.Equal(got, []string{doomed}) {
		return fmt.Errorf("swept %q, want %q", got, doomed)
	}
	if there, err := a.exists(ctx, doomed); err != nil || there != dryRun {
		return fmt.Errorf("%s exists: %v, %v after the sweep, want %v", doomed, there, err, dryRun)
	}
	return nil
}

// cli runs the keyswap command as the case's user, with args, and returns
// its exit code and output.
func (a *aclCase) cli(ctx context.Context, args ...string) (int, string, string, error) {
	for _, addr := range a.addrs {
		args = append(args, "-u", "redis://"+a.name+"@"+addr)
	}
	cmd := exec.CommandContext(ctx, a.bin, args...)
	cmd.Env = []string{"KEYSWAP_PASSWORD=" + a.pw}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), stdout.String(), stderr.String(), nil
	}
	return 0, stdout.String(), stderr.String(), err
}

// stepStatus runs keyswap status -json while a rebuild of the admin's is
// running: it must report that rebuild's lock, and the orphan as a sweep
// candidate (exit status 3).
func stepStatus(ctx context.Context, a *aclCase) error {
	doomed, err := a.orphan(ctx, "status")
	if err != nil {
		return err
	}
	s := newShape(a.prefix + "status:")
	running := make(chan struct{})
	release := make(chan struct{})
	r, err := rebuild.New(a.admin, rebuild.Options{BatchSize: 200}, s.builders()...)
	if err != nil {
		return err
	}
	runErr := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, pausedSource(v1.items(), func(ctx context.Context) error {
			close(running)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}))
		runErr <- err
	}()
	select {
	case <-running:
	case err := <-runErr:
		return fmt.Errorf("the admin's run: %w", err)
	}
	code, stdout, stderr, err := a.cli(ctx, "status", "-json", a.prefix+"status*")
	close(release)
	if rerr := <-runErr; rerr != nil {
		return fmt.Errorf("the admin's run: %w", rerr)
	}
	if err != nil {
		return err
	}
	if code != 3 {
		return fmt.Errorf("keyswap status: exit status %d, want 3 (a sweep candidate); stderr %q", code, stderr)
	}
	var rep struct {
		Locks []struct {
			Key string `json:"key"`
		} `json:"locks"`
		TempKeys []struct {
			Key            string `json:"key"`
			SweepCandidate bool   `json:"sweep_candidate"`
		} `json:"temp_keys"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		return fmt.Errorf("keyswap status -json: %w: %q", err, stdout)
	}
	var locks, candidates []string
	for _, l := range rep.Locks {
		locks = append(locks, l.Key)
	}
	for _, k := range rep.TempKeys {
		if k.SweepCandidate {
			candidates = append(candidates, k.Key)
		}
	}
	want := []string{keys.LockKey(s.email, a.cluster), keys.LockKey(s.score, a.cluster), keys.LockKey(s.country, a.cluster),
		keys.LockKeyForBase(a.prefix + "status-locked")} // the admin's run, and orphan's
	slices.Sort(want)
	slices.Sort(locks)
	if !slices.Equal(locks, want) || !slices.Equal(candidates, []string{doomed}) {
		return fmt.Errorf("keyswap status: locks %q, sweep candidates %q; want locks %q and the one candidate %s", locks, candidates, want, doomed)
	}
	return nil
}

// stepCLISweep runs keyswap sweep over the case's orphans, with --delete
// or not: exit status 0 and the orphan deleted, or 3 and the orphan kept.
func stepCLISweep(ctx context.Context, a *aclCase, del bool) error {
	name, want := "cli-dry", 3
	args := []string{"sweep"}
	if del {
		name, want = "cli-delete", 0
		args = append(args, "--delete")
	}
	doomed, err := a.orphan(ctx, name)
	if err != nil {
		return err
	}
	code, stdout, stderr, err := a.cli(ctx, append(args, "--pattern", a.prefix+name+"*:rebuild:*")...)
	if err != nil {
		return err
	}
	if code != want || !strings.Contains(stdout, doomed) {
		return fmt.Errorf("keyswap %s: exit status %d, stdout %q, stderr %q; want %d, naming %s", strings.Join(args, " "), code, stdout, stderr, want, doomed)
	}
	if there, err := a.exists(ctx, doomed); err != nil || there == del {
		return fmt.Errorf("%s exists: %v, %v after keyswap %s", doomed, there, err, strings.Join(args, " "))
	}
	return nil
}

// buildCLI builds the keyswap command into a directory of t's.
func buildCLI(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "keyswap")
	cmd := exec.CommandContext(redistest.Ctx(t), "go", "build", "-o", bin, "./cmd/keyswap")
	cmd.Dir = ".." // the repository's root, whose go.work has the command's module
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/keyswap: %v\n%s", err, out)
	}
	return bin
}

// aclPassword is the password TestMinimalACL gives its users for the CLI,
// besides the random one of ClientAs.
const aclPassword = "minimal-acl-pw"

// standaloneACL returns a case of user name with rules on a server of t's
// own, whose script cache starts empty, so that every script goes as EVAL
// once.
func standaloneACL(t *testing.T, bin, name string, rules []string) *aclCase {
	t.Helper()
	srv := redistest.OwnServer(t)
	admin := srv.Client(t)
	user := srv.ClientAs(t, name, rules...)
	redistest.Do(t, admin, admin.B().AclSetuser().Username(name).Rule(">"+aclPassword).Build())
	return &aclCase{tb: t, admin: admin, user: user, name: name, pw: aclPassword, addrs: []string{srv.Addr},
		prefix: redistest.Prefix(t), bin: bin}
}

// clusterACL returns a case of user name with rules on the package's
// cluster: ClientAs creates the user on one node and connects to it alone,
// so it is called on every node, each user is given the same second
// password, and the case's client is a cluster client of that user.
func clusterACL(t *testing.T, bin, name string, rules []string) *aclCase {
	t.Helper()
	for _, n := range env.Cluster.Nodes {
		n.ClientAs(t, name, rules...)
		admin := n.Client(t)
		redistest.Do(t, admin, admin.B().AclSetuser().Username(name).Rule(">"+aclPassword).Build())
	}
	user, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: env.Cluster.Addrs, Username: name, Password: aclPassword, DisableCache: true,
	})
	if err != nil {
		t.Fatalf("cluster client of %s: %v", name, err)
	}
	t.Cleanup(user.Close)
	if user.Mode() != rueidis.ClientModeCluster {
		t.Fatalf("the client of %s is in mode %v, want a cluster client", name, user.Mode())
	}
	admin := env.Cluster.Client(t)
	prefix := "{" + redistest.Prefix(t) + "}"
	t.Cleanup(func() {
		for _, k := range redistest.Keys(t, admin, prefix) {
			if err := admin.Do(context.Background(), admin.B().Del().Key(k).Build()).Error(); err != nil {
				t.Errorf("DEL %s: %v", k, err)
			}
		}
	})
	return &aclCase{tb: t, admin: admin, user: user, name: name, pw: aclPassword, addrs: env.Cluster.Addrs,
		prefix: prefix, bin: bin, cluster: true}
}

// deniedLog returns what ACL LOG on c recorded as denied to user: the
// command or key, and where ("toplevel", "lua", "multi").
func deniedLog(t testing.TB, c rueidis.Client, user string) []string {
	t.Helper()
	entries, err := c.Do(context.Background(), c.B().AclLog().Count(128).Build()).ToArray()
	if err != nil {
		t.Fatalf("ACL LOG: %v", err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		m, err := e.AsMap()
		if err != nil {
			t.Fatalf("ACL LOG entry: %v", err)
		}
		field := func(k string) string {
			v := m[k]
			s, _ := v.ToString()
			return s
		}
		if field("username") == user {
			seen[field("reason")+" "+field("object")+" ("+field("context")+")"] = true
		}
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestMinimalACL finds the least a Redis user needs: a user with exactly
// minimalRules runs every part of keyswap (a full rebuild, which lives
// through a heartbeat and a refresh, WithRebuild, Sweep with and without
// DryRun, keyswap status during a rebuild, keyswap sweep with and without
// --delete), standalone and on the cluster (with +cluster|slots); and a user
// without any one of minimalCommands fails at least one of them.
func TestMinimalACL(t *testing.T) {
	t.Parallel()
	bin := buildCLI(t)
	all := func(t *testing.T, a *aclCase) {
		ctx := redistest.Ctx(t)
		for _, s := range aclSteps {
			if err := s.run(ctx, a); err != nil {
				t.Errorf("%s: %v", s.name, err)
			}
		}
	}

	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		rules := minimalRules("~ks:*")
		t.Logf("rules: %s", strings.Join(rules, " "))
		a := standaloneACL(t, bin, "keyswap", rules)
		all(t, a)
		// What was refused and did not matter: the keep-alive PING,
		// ROLE (Sweep and the CLI scan a node that cannot answer it),
		// MEMORY USAGE and a string's STRLEN (status leaves them unknown),
		// CLUSTER SLOTS (the CLI's client falls back to one node).
		t.Logf("denied, without harm: %q", deniedLog(t, a.admin, a.name))
	})

	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		rules := append(minimalRules("~{ks:*"), "+cluster|slots")
		t.Logf("rules: %s", strings.Join(rules, " "))
		a := clusterACL(t, bin, "ks-minimal-cluster", rules)
		all(t, a)
	})

	t.Run("each command is needed", func(t *testing.T) {
		t.Parallel()
		for _, cmd := range minimalCommands {
			t.Run(cmd, func(t *testing.T) {
				t.Parallel()
				ctx := redistest.Ctx(t)
				a := standaloneACL(t, bin, "ks-without-"+cmd, minimalRules("~ks:*", cmd))
				for _, s := range aclSteps {
					if err := s.run(ctx, a); err != nil {
						t.Logf("without +%s, %s fails: %v", cmd, s.name, err)
						return
					}
				}
				t.Errorf("without +%s every part of keyswap works: the rule is not needed", cmd)
			})
		}
	})
}

// TestHeartbeatRightsCheckedUpFront: a user without HMGET or LLEN, which
// only the heartbeat script sends, used to pass the acquire script's rights
// check, write its batches, and then, every heartbeat being refused (NOPERM
// inside the script) and taken for a transient failure, end after its TTL
// with ErrLockLost, "the process or the network stalled". The acquire now
// checks the rights of every later step, and a refused heartbeat fails the
// run at once: the run fails with ErrNoPermission naming the command before
// anything is written.
func TestHeartbeatRightsCheckedUpFront(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"hmget", "llen"} {
		t.Run(cmd, func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t)
			srv := redistest.OwnServer(t)
			admin := srv.Client(t)
			prefix := redistest.Prefix(t)
			live := prefix + "by-email"
			redistest.SeedHash(t, admin, live, prodOld)
			before := redistest.Snapshot(t, admin, prefix)
			c := srv.ClientAs(t, "ks-without-"+cmd, minimalRules("~ks:*", cmd)...)
			o := prodOptions()
			o.TTL = aclRunTTL
			// A run longer than its lease: halfway, the source waits
			// for two leases (or for the run to end).
			src := func(ctx context.Context) iter.Seq2[int, error] {
				return func(yield func(int, error) bool) {
					for i := range prodFields {
						if i == prodFields/2 {
							select {
							case <-ctx.Done():
								return
							case <-time.After(2 * aclRunTTL):
							}
						}
						if !yield(i, nil) {
							return
						}
					}
				}
			}
			r := redistest.Rebuilder(t, c, o, prodHash(live))
			stats, err := r.Run(ctx, src)
			t.Logf("Run after %d batches: %v", stats.Batches, err)
			redistest.WantHash(t, admin, live, prodOld)
			redistest.WantUnchanged(t, admin, prefix, before)
			if !errors.Is(err, rebuild.ErrNoPermission) || !strings.Contains(err.Error(), strings.ToUpper(cmd)) {
				t.Errorf("err = %v, want ErrNoPermission naming %s", err, strings.ToUpper(cmd))
			}
			if stats.Batches != 0 {
				t.Errorf("Stats.Batches = %d, want 0: a missing right is found before anything is written", stats.Batches)
			}
		})
	}
}
