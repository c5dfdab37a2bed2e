package run_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/internal/run"
)

// env holds the package's redis-server processes: one standalone server and
// a 3-master cluster, started by TestMain. Most of this package runs
// through the store and rebuild suites, which drive it; these tests reach
// what their APIs do not.
var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }

// errLostReply is the error a dropped connection gives after the command left.
var errLostReply = fmt.Errorf("read tcp: %w", context.DeadlineExceeded)

func TestScriptsMultiKey(t *testing.T) {
	// The multi-key branches, which the Store's one-key API does not
	// reach: two live keys locked under one token, touched, published
	// together with an orphan, released.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		ctx := redistest.Ctx(t)
		core := run.New(d.Client, nil)
		a, b, orphan := d.Prefix+"a", d.Prefix+"b", d.Prefix+"orphan"
		redistest.Clean(t, d.Other, a, b, orphan, core.LockKey(a), core.LockKey(b))
		locks, err := core.Acquire(ctx, "acquire", []string{a, b}, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		tempA, tempB := core.NewTempKey(a, time.Now()), core.NewTempKey(b, time.Now())
		redistest.Clean(t, d.Other, tempA, tempB)
		redistest.SeedHash(t, d.Other, a, redistest.Fields("oldA", 6))
		redistest.SeedHash(t, d.Other, b, redistest.Fields("oldB", 6))
		redistest.SeedHash(t, d.Other, orphan, redistest.Fields("orphan", 2))
		redistest.SeedHash(t, d.Other, tempA, redistest.Fields("newA", 3)) // written, not yet touched: no TTL
		shorten := func(keys ...string) {
			for _, key := range keys {
				redistest.Cmd(t, d.Other, "EXPIRE", key, "10")
			}
		}

		// lease {1, 2, 0}, then {1, 1, 0}; every lock extended.
		shorten(locks[0].Key, locks[1].Key)
		states, err := core.Touch(ctx, "touch", locks, []string{tempA, tempB})
		if want := []run.TempState{run.TempCreated, run.TempAbsent}; err != nil || !slices.Equal(states, want) {
			t.Fatalf("first TouchAll = %v, %v; want %v, nil", states, err, want)
		}
		for _, key := range []string{locks[0].Key, locks[1].Key, tempA} {
			redistest.WantPTTL(t, d.Other, key, 10*time.Second, 60*time.Second)
		}
		redistest.WantAbsent(t, d.Other, tempB)
		states, err = core.Touch(ctx, "touch", locks, []string{tempA, tempB})
		if want := []run.TempState{run.TempAlive, run.TempAbsent}; err != nil || !slices.Equal(states, want) {
			t.Fatalf("second TouchAll = %v, %v; want %v, nil", states, err, want)
		}

		// lease {-1, 2}: the error names b, and nothing changed.
		shorten(locks[0].Key, tempA)
		redistest.Cmd(t, d.Other, "SET", locks[1].Key, "thief", "EX", "20")
		_, err = core.Touch(ctx, "touch", locks, []string{tempA, tempB})
		redistest.WantErr(t, err, run.ErrLockLost)
		if !strings.Contains(err.Error(), b) {
			t.Errorf("error %q does not name %s, whose lock was lost", err, b)
		}
		redistest.WantLock(t, d.Other, locks[0].Key, locks[0].Token, 10*time.Second)
		redistest.WantLock(t, d.Other, locks[1].Key, "thief", 20*time.Second)
		redistest.WantPTTL(t, d.Other, tempA, 0, 10*time.Second)
		redistest.Cmd(t, d.Other, "SET", locks[1].Key, locks[1].Token, "EX", "10")

		// publish {0, 2}: b was seen populated and is gone; nothing changed.
		_, err = core.Publish(ctx, run.PublishOptions{Op: "publish", Key: a, PreserveFor: time.Hour, Locks: locks, Orphans: []string{orphan}, Targets: []run.Target{
			{Temp: tempA, Live: a, Populated: true}, {Temp: tempB, Live: b, Populated: true},
		}})
		redistest.WantErr(t, err, run.ErrTempKeyLost)
		if !strings.Contains(err.Error(), tempB) {
			t.Errorf("error %q does not name the lost temp key %s", err, tempB)
		}
		redistest.WantHash(t, d.Other, a, redistest.Fields("oldA", 6))
		redistest.WantHash(t, d.Other, b, redistest.Fields("oldB", 6))
		redistest.WantHash(t, d.Other, orphan, redistest.Fields("orphan", 2))
		redistest.WantPTTL(t, d.Other, tempA, 0, 10*time.Second)

		// publish {1, 1, 2}: a renamed, b emptied, the orphan unlinked.
		out, err := core.Publish(ctx, run.PublishOptions{Op: "publish", Key: a, PreserveFor: time.Hour, Locks: locks, Orphans: []string{orphan}, Targets: []run.Target{
			{Temp: tempA, Live: a, Populated: true}, {Temp: tempB, Live: b},
		}})
		if want := []run.Outcome{run.Swapped, run.Emptied}; err != nil || !slices.Equal(out, want) {
			t.Fatalf("Publish = %v, %v; want %v, nil", out, err, want)
		}
		redistest.WantHash(t, d.Other, a, redistest.Fields("newA", 3))
		for _, key := range []string{tempA, tempB, b, orphan} {
			redistest.WantAbsent(t, d.Other, key)
		}
		redistest.WantLock(t, d.Other, locks[0].Key, locks[0].Token, 10*time.Second)
		redistest.WantLock(t, d.Other, locks[1].Key, locks[1].Token, 10*time.Second)

		// release 1 of 2: ours goes, the thief's stays.
		redistest.Cmd(t, d.Other, "SET", locks[1].Key, "thief", "EX", "20")
		redistest.WantErr(t, core.Release(ctx, locks), run.ErrLockLost)
		redistest.WantString(t, d.Other, locks[0].Key, "")
		redistest.WantLock(t, d.Other, locks[1].Key, "thief", 20*time.Second)
	})
}

func TestSettleAnswers(t *testing.T) {
	// An answer from Redis is not a lost reply: Settle returns it unchanged
	// and releases nothing (C31: the caller releases).
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		ctx := redistest.Ctx(t)
		core := run.New(d.Client, nil)
		live := d.Prefix + "idx"
		locks, err := core.Acquire(ctx, "acquire", []string{live}, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		lock := locks[0]
		t.Cleanup(func() { redistest.Cmd(t, d.Other, "DEL", lock.Key) })
		serverErr := d.Client.Do(ctx, d.Client.B().Arbitrary("EVAL").Args("return redis.error_reply('ERR injected')", "0").Build()).Error()
		for name, perr := range map[string]error{
			"server error":  &run.Error{Op: "publish", Key: live, Err: serverErr},
			"lock lost":     &run.Error{Op: "publish", Key: live, Err: run.ErrLockLost},
			"temp key lost": &run.Error{Op: "publish", Key: live, Err: run.ErrTempKeyLost},
			"nil":           nil,
		} {
			published, err := core.Settle(ctx, perr, locks)
			if published || err != perr {
				t.Errorf("%s: Settle = %v, %v; want false and the same error", name, published, err)
			}
		}
		redistest.WantString(t, d.Other, lock.Key, lock.Token)
		// Unfenced: nothing can stop a script in flight, so nothing to settle.
		if published, err := core.Settle(ctx, errLostReply, nil); published || err != errLostReply {
			t.Errorf("unfenced: Settle = %v, %v; want false and the same error", published, err)
		}
	})
}
