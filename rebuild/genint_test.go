package rebuild_test

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// serverMillis returns the server's clock (TIME), in milliseconds.
func serverMillis(t *testing.T, c rueidis.Client) int64 {
	t.Helper()
	clock, err := c.Do(redistest.Ctx(t), c.B().Time().Build()).AsStrSlice()
	if err != nil || len(clock) != 2 {
		t.Fatalf("TIME: %v, %v", clock, err)
	}
	sec, _ := strconv.ParseInt(clock[0], 10, 64)
	usec, _ := strconv.ParseInt(clock[1], 10, 64)
	return sec*1000 + usec/1000
}

func TestGenerationsRetireStampsServerClock(t *testing.T) {
	// C89: the flip stamps the generation it retires with the server's
	// clock, which the sweep measures the grace on.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d.Clear(t)
		ctx := redistest.Ctx(t)
		prefix := genPrefix(d)
		r := genRebuilder(t, d, prefix, rebuild.Options{Grace: -1})
		if _, err := r.Run(ctx, sources.Slice(genUsers(10, 2))); err != nil {
			t.Fatal(err)
		}
		before := serverMillis(t, d.Other)
		if _, err := r.Run(ctx, sources.Slice(genUsers(10, 2))); err != nil {
			t.Fatal(err)
		}
		after := serverMillis(t, d.Other)
		state := redistest.HGetAll(t, d.Other, keys.RegistryKey(prefix, d.Cluster))["1"]
		ms, err := strconv.ParseInt(strings.TrimPrefix(state, keys.RegRetired), 10, 64)
		if !strings.HasPrefix(state, keys.RegRetired) || err != nil || ms < before || ms > after {
			t.Errorf("generation 1 is %q, want retired:<ms> between the server's %d and %d", state, before, after)
		}
	})
}

func TestRebuilderSweep(t *testing.T) {
	// C91: Sweep removes the generations runs left behind: one retired
	// past the grace (the run's Grace was negative) and one a crashed run
	// built (building, its lock free); it keeps the current one, and
	// leaves nothing of the others.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		prefix := genPrefix(d)
		us := genUsers(20, 4)
		r := genRebuilder(t, d, prefix, rebuild.Options{Grace: -1})
		for range 2 {
			if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
				t.Fatal(err)
			}
		}
		// A run that crashed while it built generation 3.
		reg := keys.RegistryKey(prefix, d.Cluster)
		redistest.Cmd(t, d.Other, "HSET", reg, keys.RegNext, "3", "3", keys.RegBuilding+"crashed")
		for _, b := range []string{"b00", "b01", "b07"} {
			redistest.Cmd(t, d.Other, "SADD", keys.GenBucketKey(prefix, 3, b), "x")
		}
		sweeper := genRebuilder(t, d, prefix, rebuild.Options{Grace: time.Millisecond})
		removed := map[int64]bool{}
		for deadline := time.Now().Add(10 * time.Second); len(removed) < 2; {
			stats, err := sweeper.Sweep(ctx)
			if err != nil {
				t.Fatal(err)
			}
			s := stats.Indexes[prefix]
			for _, g := range s.Removed {
				removed[g] = true
			}
			for _, k := range s.Kept {
				if k.Gen != 2 && k.Gen != 1 {
					t.Errorf("kept %+v, want only 2 (current) and 1 (until its grace ends)", k)
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("removed %v, want 1 and 3", removed)
			}
		}
		if !removed[1] || !removed[3] {
			t.Errorf("removed %v, want 1 and 3", removed)
		}
		wantGeneration(t, d, prefix, 2, 3, map[string]string{"2": keys.RegCurrent}, us)
		wantNoGeneration(t, d, prefix, 1)
		wantNoGeneration(t, d, prefix, 3)
		wantGenClean(t, d, prefix, 2)
	})
}

func TestGenerationsACLPreCheck(t *testing.T) {
	// C93: the rights the acquire checks include the commands Generations
	// mode sends (the registry's, the pointer's, the sweep's SCAN and
	// TIME), and those of a RenameInPlace publish's switch back: a user
	// without one fails at the acquire, before writing anything, with
	// ErrNoPermission naming it.
	// A RenameInPlace run checks TIME at its publish alone, before any
	// write, where it has a generation to retire: most of its runs never
	// send it.
	for _, tc := range []struct {
		mode    rebuild.PublishMode
		deny    string
		command string
		op      string
	}{
		{rebuild.Generations, "-hgetall", "HGETALL", "acquire"},
		{rebuild.Generations, "-hincrby", "HINCRBY", "acquire"},
		{rebuild.Generations, "-time", "TIME", "acquire"},
		{rebuild.Generations, "-scan", "SCAN", "acquire"},
		{rebuild.RenameInPlace, "-hgetall", "HGETALL", "acquire"},
		{rebuild.RenameInPlace, "-time", "TIME", "publish"},
	} {
		t.Run(tc.mode.String()+tc.deny, func(t *testing.T) {
			t.Parallel()
			ctx := redistest.Ctx(t)
			srv := redistest.OwnServer(t)
			admin := srv.Client(t)
			prefix := redistest.Prefix(t)
			email := prefix + "users:by-email"
			hash := func(c rueidis.Client, mode rebuild.PublishMode) *rebuild.Rebuilder[user] {
				return redistest.Rebuilder(t, c, rebuild.Options{Publish: mode, Grace: -1},
					builders.Hash(email, func(u user) (string, string, bool) { return u.Email, u.ID, true }))
			}
			// An index published in Generations mode by a user with every
			// right: the pointer and the registry exist.
			if _, err := hash(admin, rebuild.Generations).Run(ctx, sources.Slice(users(5))); err != nil {
				t.Fatal(err)
			}
			before := redistest.Snapshot(t, admin, prefix)
			c := srv.ClientAs(t, "ks-"+strings.ReplaceAll(t.Name(), "/", "-"), "~*", "+@all", tc.deny)
			stats, err := hash(c, tc.mode).Run(ctx, sources.Slice(users(8)))
			redistest.WantErr(t, err, rebuild.ErrNoPermission)
			if !strings.Contains(err.Error(), tc.command) {
				t.Errorf("Run: %v, want it to name %s", err, tc.command)
			}
			var e *rebuild.Error
			if !errors.As(err, &e) || e.Op != tc.op {
				t.Errorf("Run: %v, want an *Error of op %s", err, tc.op)
			}
			if tc.op == "acquire" && stats.Batches != 0 {
				t.Errorf("Stats.Batches = %d, want 0", stats.Batches)
			}
			redistest.WantUnchanged(t, admin, prefix, before)
		})
	}
}

func TestGenerationsACLManifestList(t *testing.T) {
	// C93: the removal of a family's previous generation reads its
	// manifest's list with LLEN before its LRANGEs: a user who may not run
	// it there fails at the acquire, nothing written, rather than
	// publishing and then leaving the previous generation. (TYPE, which the
	// removal sends there too, is checked on many keys; denied, it fails
	// the acquire whatever the list.)
	t.Parallel()
	ctx := redistest.Ctx(t)
	srv := redistest.OwnServer(t)
	admin := srv.Client(t)
	prefix := redistest.Prefix(t) + "users:by-country"
	set := func(c rueidis.Client) *rebuild.Rebuilder[user] {
		return redistest.Rebuilder(t, c, rebuild.Options{Publish: rebuild.Generations, Grace: -1},
			builders.SetIndex(prefix, func(u user) (string, string, bool) { return u.Country, u.ID, true }))
	}
	if _, err := set(admin).Run(ctx, sources.Slice(genUsers(10, 2))); err != nil {
		t.Fatal(err)
	}
	before := redistest.Snapshot(t, admin, prefix)
	// Every right, LLEN on every key but a manifest's list.
	c := srv.ClientAs(t, "ks-manifest-llen", "~*", "+@all", "-llen",
		"(~*:rebuild-lock* ~*:rebuild-gens ~*:rebuild-ptr ~*:rebuild-m:* ~*:rebuild-g:* +llen)")
	_, err := set(c).Run(ctx, sources.Slice(genUsers(12, 3)))
	redistest.WantErr(t, err, rebuild.ErrNoPermission)
	if list := keys.ManifestListKey(prefix, false, 0); !strings.Contains(err.Error(), "LLEN") || !strings.Contains(err.Error(), strings.TrimSuffix(list, "0")) {
		t.Errorf("Run: %v, want it to name LLEN and the manifest's list", err)
	}
	redistest.WantUnchanged(t, admin, prefix, before)
}

func TestGenerationsACLCutOverMark(t *testing.T) {
	// C93, C98: the rights the acquire checks cover the cut-over mark
	// (<lock>:cut): GET, which every flip sends, and, for a run that may
	// cut over (a family without a hash tag on a cluster), SET and DEL. A
	// user who may run the command on every key but the mark fails at the
	// acquire with ErrNoPermission naming the command and the mark,
	// writing nothing.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		cmds := []string{"GET"}
		if d.Cluster {
			cmds = append(cmds, "SET", "DEL")
		}
		for _, cmd := range cmds {
			t.Run(cmd, func(t *testing.T) {
				ctx, d, prefix, us := published(t, d)
				mark := keys.CutOverKey(keys.LockKey(prefix, d.Cluster))
				// The command on every key that does not end in "t": of
				// the run's keys, only the mark ("<lock>:cut") does.
				c := clientAs(t, d, "~*", "+@all", "-"+cmd, "(~*[^t] +"+cmd+")")
				// The index's keys, and on the cluster those keyswap keeps
				// next to them, under "{<prefix>}".
				under := []string{prefix, "{" + prefix}
				var before []map[string]redistest.KeyState
				for _, p := range under {
					before = append(before, redistest.Snapshot(t, d.Other, p))
				}
				stats, err := spreadRebuilder(t, c, prefix, rebuild.Options{}).Run(ctx, sources.Slice(genUsers(30, 3)))
				redistest.WantErr(t, err, rebuild.ErrNoPermission)
				if err != nil && (!strings.Contains(err.Error(), cmd) || !strings.Contains(err.Error(), mark)) {
					t.Errorf("Run: %v, want it to name %s and %s", err, cmd, mark)
				}
				var e *rebuild.Error
				if !errors.As(err, &e) || e.Op != "acquire" {
					t.Errorf("Run: %v, want an *Error of op acquire", err)
				}
				if stats.Batches != 0 {
					t.Errorf("Stats.Batches = %d, want 0", stats.Batches)
				}
				for i, p := range under {
					redistest.WantUnchanged(t, d.Other, p, before[i])
				}
				wantGeneration(t, d, prefix, 1, 1, map[string]string{"1": keys.RegCurrent}, us)
			})
		}
	})
}

func TestGenerationsFlipReplyLost(t *testing.T) {
	// C89: the flip's reply is lost and the release that would read its
	// receipt fails too: the run fails with ErrOutcomeUnknown and removes
	// its generation with gens.RemoveOwn, which removes it only if the
	// flip did not run. A flip that ran leaves the pointer on the run's
	// generation, whole; one that did not leaves no key of it.
	for _, ran := range []bool{true, false} {
		t.Run(fmt.Sprintf("ran=%v", ran), func(t *testing.T) {
			forEachDeployment(t, func(t *testing.T, d deployment) {
				d.Clear(t)
				ctx := redistest.Ctx(t)
				prefix := genPrefix(d)
				first := genUsers(20, 4)
				if _, err := genRebuilder(t, d, prefix, rebuild.Options{}).Run(ctx, sources.Slice(first)); err != nil {
					t.Fatal(err)
				}
				flip, release := redistest.ScriptNamed("flip"), redistest.ScriptNamed("release")
				var releases atomic.Int32
				c := rueidishook.WithHook(d.Client, redistest.Hook{OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
					args := cmd.Commands()
					switch {
					case flip.Is(args):
						if !ran {
							return rueidis.NewErrorResult(fmt.Errorf("write tcp: %w", context.DeadlineExceeded))
						}
						res := c.Do(ctx, cmd)
						if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
							return res // rueidis falls back to EVAL, which comes here too
						}
						if err := res.Error(); err != nil {
							t.Errorf("flip: %v", err)
						}
						return rueidis.NewErrorResult(fmt.Errorf("read tcp: %w", context.DeadlineExceeded))
					case release.Is(args) && releases.Add(1) == 1:
						return rueidis.NewErrorResult(fmt.Errorf("dial tcp: %w", context.DeadlineExceeded))
					}
					return c.Do(ctx, cmd)
				}})
				second := genUsers(30, 5)
				r := redistest.Rebuilder(t, c, rebuild.Options{Publish: rebuild.Generations, Grace: -1, BatchSize: 50},
					builders.SetIndex(prefix, func(u user) (string, string, bool) { return u.Country, u.ID, true }))
				_, err := r.Run(ctx, sources.Slice(second))
				redistest.WantErr(t, err, rebuild.ErrOutcomeUnknown)
				if ran {
					old := redistest.HGetAll(t, d.Other, keys.RegistryKey(prefix, d.Cluster))["1"]
					if !strings.HasPrefix(old, keys.RegRetired) {
						t.Errorf("generation 1 is %q, want retired", old)
					}
					wantGeneration(t, d, prefix, 2, 2, map[string]string{"2": keys.RegCurrent, "1": old}, second)
					wantGenClean(t, d, prefix, 1, 2)
				} else {
					wantGeneration(t, d, prefix, 1, 2, map[string]string{"1": keys.RegCurrent}, first)
					wantNoGeneration(t, d, prefix, 2)
					wantGenClean(t, d, prefix, 1)
				}
			})
		})
	}
}

func TestSwitchBackRetiresPrevious(t *testing.T) {
	// C92: the switch back to RenameInPlace retires the previous
	// generation kept for a rollback too, stamped with the server's clock,
	// and deletes the pointer in the same step as it publishes the plain
	// keys.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		d.Clear(t)
		ctx := redistest.Ctx(t)
		prefix := d.Prefix + "users:by-bucket"
		for range 2 {
			r := genRebuilder(t, d, prefix, rebuild.Options{KeepPrevious: time.Minute})
			if _, err := r.Run(ctx, sources.Slice(genUsers(10, 2))); err != nil {
				t.Fatal(err)
			}
		}
		before := serverMillis(t, d.Other)
		us := genUsers(12, 3)
		r := redistest.Rebuilder(t, d.Client, rebuild.Options{},
			builders.SetIndex(prefix, func(u user) (string, string, bool) { return u.Country, u.ID, true }))
		if _, err := r.Run(ctx, sources.Slice(us)); err != nil {
			t.Fatal(err)
		}
		after := serverMillis(t, d.Other)
		redistest.WantAbsent(t, d.Other, keys.PointerKey(prefix, d.Cluster))
		reg := redistest.HGetAll(t, d.Other, keys.RegistryKey(prefix, d.Cluster))
		if len(reg) != 3 || reg[keys.RegNext] != "2" || reg["1"] != reg["2"] {
			t.Errorf("registry %v, want generations 1 and 2 retired at the same time", reg)
		}
		ms, err := strconv.ParseInt(strings.TrimPrefix(reg["1"], keys.RegRetired), 10, 64)
		if !strings.HasPrefix(reg["1"], keys.RegRetired) || err != nil || ms < before || ms > after {
			t.Errorf("generation 1 is %q, want retired:<ms> between the server's %d and %d", reg["1"], before, after)
		}
		for b, ids := range bucketsOf(us) {
			if got := redistest.SMembers(t, d.Other, prefix+":"+b); !slices.Equal(got, ids) {
				t.Errorf("%s:%s = %v, want %v", prefix, b, got, ids)
			}
		}
	})
}
