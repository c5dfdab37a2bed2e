package protocol_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// env holds the package's redis-server processes: one standalone server and
// a 3-master cluster, started by TestMain. Most of this package runs
// through the store and rebuild suites, which drive it; these tests reach
// what their APIs do not.
var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }

func TestScriptsMultiKey(t *testing.T) {
	// The multi-key branches, which the Store's one-key API does not
	// reach: two live keys locked under one token, touched, published
	// together with an orphan, released.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		ctx := redistest.Ctx(t)
		core := protocol.New(d.Client, nil)
		a, b, orphan := d.Prefix+"a", d.Prefix+"b", d.Prefix+"orphan"
		redistest.Clean(t, d.Other, a, b, orphan, core.LockKey(a), core.LockKey(b))
		locks, err := core.Locks.Acquire(ctx, protocol.AcquireOptions{Op: "acquire", Key: a, Lives: []string{a, b}, TTL: 60 * time.Second, Mode: protocol.ModeRebuild})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range locks {
			redistest.Clean(t, d.Other, keys.RecordKey(l.Key), keys.LogKey(l.Key))
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
		states, err := core.Lease.Touch(ctx, "touch", locks, []string{tempA, tempB})
		if want := []protocol.TempState{protocol.TempCreated, protocol.TempAbsent}; err != nil || !slices.Equal(states, want) {
			t.Fatalf("first TouchAll = %v, %v; want %v, nil", states, err, want)
		}
		for _, key := range []string{locks[0].Key, locks[1].Key, tempA} {
			redistest.WantPTTL(t, d.Other, key, 10*time.Second, 60*time.Second)
		}
		redistest.WantAbsent(t, d.Other, tempB)
		states, err = core.Lease.Touch(ctx, "touch", locks, []string{tempA, tempB})
		if want := []protocol.TempState{protocol.TempAlive, protocol.TempAbsent}; err != nil || !slices.Equal(states, want) {
			t.Fatalf("second TouchAll = %v, %v; want %v, nil", states, err, want)
		}

		// lease {-1, 2}: the error names b, and nothing changed.
		shorten(locks[0].Key, tempA)
		redistest.Cmd(t, d.Other, "SET", locks[1].Key, "thief", "EX", "20")
		_, err = core.Lease.Touch(ctx, "touch", locks, []string{tempA, tempB})
		redistest.WantErr(t, err, protocol.ErrLockLost)
		if !strings.Contains(err.Error(), b) {
			t.Errorf("error %q does not name %s, whose lock was lost", err, b)
		}
		redistest.WantLock(t, d.Other, locks[0].Key, locks[0].Token, 10*time.Second)
		redistest.WantLock(t, d.Other, locks[1].Key, "thief", 20*time.Second)
		redistest.WantPTTL(t, d.Other, tempA, 0, 10*time.Second)
		redistest.Cmd(t, d.Other, "SET", locks[1].Key, locks[1].Token, "EX", "10")

		// publish {0, 2}: b was seen populated and is gone; nothing changed.
		_, err = core.Publisher.Publish(ctx, protocol.PublishOptions{Op: "publish", Key: a, PreserveFor: time.Hour, Locks: locks, Orphans: []string{orphan}, Targets: []protocol.Target{
			{Temp: tempA, Live: a, Populated: true}, {Temp: tempB, Live: b, Populated: true},
		}})
		redistest.WantErr(t, err, protocol.ErrTempKeyLost)
		if !strings.Contains(err.Error(), tempB) {
			t.Errorf("error %q does not name the lost temp key %s", err, tempB)
		}
		redistest.WantHash(t, d.Other, a, redistest.Fields("oldA", 6))
		redistest.WantHash(t, d.Other, b, redistest.Fields("oldB", 6))
		redistest.WantHash(t, d.Other, orphan, redistest.Fields("orphan", 2))
		redistest.WantPTTL(t, d.Other, tempA, 0, 10*time.Second)

		// publish {1, 1, 2}: a renamed, b emptied, the orphan unlinked.
		p, err := core.Publisher.Publish(ctx, protocol.PublishOptions{Op: "publish", Key: a, PreserveFor: time.Hour, Locks: locks, Orphans: []string{orphan}, Targets: []protocol.Target{
			{Temp: tempA, Live: a, Populated: true}, {Temp: tempB, Live: b},
		}})
		if want := []protocol.Outcome{protocol.Swapped, protocol.Emptied}; err != nil || !slices.Equal(p.Outcomes, want) {
			t.Fatalf("Publish = %v, %v; want %v, nil", p.Outcomes, err, want)
		}
		redistest.WantHash(t, d.Other, a, redistest.Fields("newA", 3))
		for _, key := range []string{tempA, tempB, b, orphan} {
			redistest.WantAbsent(t, d.Other, key)
		}
		redistest.WantLock(t, d.Other, locks[0].Key, locks[0].Token, 10*time.Second)
		redistest.WantLock(t, d.Other, locks[1].Key, locks[1].Token, 10*time.Second)

		// release 1 of 2: ours goes, the thief's stays.
		redistest.Cmd(t, d.Other, "SET", locks[1].Key, "thief", "EX", "20")
		redistest.WantErr(t, core.Locks.Release(ctx, locks), protocol.ErrLockLost)
		redistest.WantString(t, d.Other, locks[0].Key, "")
		redistest.WantLock(t, d.Other, locks[1].Key, "thief", 20*time.Second)
	})
}

func TestPublishAnswersAreNotSettled(t *testing.T) {
	// An answer from Redis is not a lost reply: Publish returns it, even
	// with Settle, and releases nothing (C31: the caller releases).
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		ctx := redistest.Ctx(t)
		serverErr := d.Client.Do(ctx, d.Client.B().Arbitrary("EVAL").Args("return redis.error_reply('ERR injected')", "0").Build()).Error()
		if !protocol.IsServerReply(serverErr) {
			t.Fatalf("the injected error %v is not a server reply", serverErr)
		}
		publish := redistest.ScriptNamed("publish")
		hooked := rueidishook.WithHook(d.Client, redistest.Hook{OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			if publish.Is(cmd.Commands()) {
				return rueidis.NewErrorResult(serverErr)
			}
			return c.Do(ctx, cmd)
		}})
		core := protocol.New(hooked, nil)
		live := d.Prefix + "idx"
		locks, err := core.Locks.Acquire(ctx, protocol.AcquireOptions{Op: "acquire", Key: live, Lives: []string{live}, TTL: 60 * time.Second, Mode: protocol.ModeRebuild})
		if err != nil {
			t.Fatal(err)
		}
		lock := locks[0]
		t.Cleanup(func() { _ = core.Locks.Release(context.Background(), locks) })
		temp := core.NewTempKey(live, time.Now())
		redistest.Clean(t, d.Other, temp)
		_, err = core.Publisher.Publish(ctx, protocol.PublishOptions{Op: "publish", Key: live, Locks: locks, Settle: true, PreserveFor: time.Minute,
			Targets: []protocol.Target{{Temp: temp, Live: live}}})
		if !errors.Is(err, serverErr) {
			t.Errorf("Publish = %v, want the server's error", err)
		}
		if protocol.PublishRefused(err) {
			t.Errorf("PublishRefused(%v) = true, want false: the script failed, it did not refuse", err)
		}
		redistest.WantString(t, d.Other, lock.Key, lock.Token)
	})
}
