package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// settleRebuild runs a WithRebuild of tg.final with new contents through a
// client whose publish script is handled by onPublish, and returns its
// error. onRelease, when set, handles the release script.
func settleRebuild(t *testing.T, tg target, onPublish, onRelease func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult) error {
	t.Helper()
	c := rueidishook.WithHook(tg.client, hook{onDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
		switch {
		case isScript(t, cmd, "publish") && onPublish != nil:
			return onPublish(c, ctx, cmd)
		case isScript(t, cmd, "release") && onRelease != nil:
			return onRelease(c, ctx, cmd)
		}
		return c.Do(ctx, cmd)
	}})
	s := store.New(c, store.Options{})
	return s.WithRebuild(ctxT(t), tg.final, store.RebuildOptions{TTL: 60 * time.Second, PreserveFor: 120 * time.Second},
		func(ctx context.Context, temp string, touch func(context.Context) error) error {
			return tg.client.Do(ctx, tg.client.B().Hset().Key(temp).FieldValue().FieldValue("f", "new").Build()).Error()
		})
}

// errLostReply is the error a dropped connection gives after the command left.
var errLostReply = fmt.Errorf("read tcp: %w", context.DeadlineExceeded)

func TestSettleLostReplyAfterThePublishRan(t *testing.T) {
	// The publish script ran, its reply was lost: WithRebuild finds out
	// from the receipt and reports the publish it made, instead of a
	// failure that is not one.
	forEachTarget(t, func(t *testing.T, tg target) {
		seedHash(t, tg.other, tg.final, map[string]string{"f": "old"})
		err := settleRebuild(t, tg, func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			r := c.Do(ctx, cmd)
			if rerr, ok := rueidis.IsRedisErr(r.Error()); ok && rerr.IsNoScript() {
				return r // let rueidis fall back to EVAL, which comes here too
			}
			if err := r.Error(); err != nil {
				t.Errorf("publish: %v", err)
			}
			return rueidis.NewErrorResult(errLostReply)
		}, nil)
		if err != nil {
			t.Fatalf("WithRebuild = %v, want nil: the publish happened", err)
		}
		wantHash(t, tg.other, tg.final, map[string]string{"f": "new"})
		s := store.New(tg.client, store.Options{})
		wantLock(t, tg.other, s.LockKey(tg.final), "")
		wantAbsent(t, tg.other, s.LockKey(tg.final)+":done") // the receipt was taken
	})
}

func TestSettleLostReplyBeforeThePublishRan(t *testing.T) {
	// The publish script never left: no receipt, so WithRebuild reports the
	// error, and the live key is the old one. The temp key is kept for
	// PreserveFor (C29).
	forEachTarget(t, func(t *testing.T, tg target) {
		seedHash(t, tg.other, tg.final, map[string]string{"f": "old"})
		var temp string
		err := settleRebuild(t, tg, func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			args := cmd.Commands()
			temp = args[4] // EVALSHA sha numkeys lock temp ...
			return rueidis.NewErrorResult(errLostReply)
		}, nil)
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, store.ErrOutcomeUnknown) {
			t.Fatalf("WithRebuild = %v, want the lost reply's error, not ErrOutcomeUnknown", err)
		}
		wantHash(t, tg.other, tg.final, map[string]string{"f": "old"})
		wantTTL(t, tg.other, temp, 120*time.Second)
		if got := pttl(t, tg.other, temp); got <= 60*time.Second {
			t.Errorf("temp PTTL %v, want PreserveFor (120 s), not the lease", got)
		}
		wantLock(t, tg.other, store.New(tg.client, store.Options{}).LockKey(tg.final), "")
	})
}

func TestSettleUnreachable(t *testing.T) {
	// The reply was lost and the release that would settle it fails too:
	// the outcome is unknown, and the error says so while still matching
	// the original cause. The live key is old or new, never partial.
	forEachTarget(t, func(t *testing.T, tg target) {
		seedHash(t, tg.other, tg.final, map[string]string{"f": "old"})
		var releases atomic.Int32
		err := settleRebuild(t, tg, func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			return rueidis.NewErrorResult(errLostReply)
		}, func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			releases.Add(1)
			return rueidis.NewErrorResult(fmt.Errorf("dial tcp: %w", context.DeadlineExceeded))
		})
		if !errors.Is(err, store.ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WithRebuild = %v, want ErrOutcomeUnknown wrapping the lost reply", err)
		}
		if !strings.Contains(err.Error(), tg.final) {
			t.Errorf("error %q does not name the live key", err)
		}
		if releases.Load() == 0 {
			t.Error("no release was attempted")
		}
		wantHash(t, tg.other, tg.final, map[string]string{"f": "old"})
		// The lock could not be released: it expires within its TTL.
		wantTTL(t, tg.other, store.New(tg.client, store.Options{}).LockKey(tg.final), 60*time.Second)
		do(t, tg.other, "DEL", store.New(tg.client, store.Options{}).LockKey(tg.final))
	})
}

func TestSettleAnswers(t *testing.T) {
	// An answer from Redis is not a lost reply: Settle returns it unchanged
	// and releases nothing (C31: the caller releases).
	forEachTarget(t, func(t *testing.T, tg target) {
		ctx := ctxT(t)
		s := tg.store(store.Options{})
		lock, err := s.Acquire(ctx, tg.final, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { do(t, tg.other, "DEL", lock.Key) })
		serverErr := tg.client.Do(ctx, tg.client.B().Arbitrary("EVAL").Args("return redis.error_reply('ERR injected')", "0").Build()).Error()
		for name, perr := range map[string]error{
			"server error":  &store.Error{Op: "publish", Key: tg.final, Err: serverErr},
			"lock lost":     &store.Error{Op: "publish", Key: tg.final, Err: store.ErrLockLost},
			"temp key lost": &store.Error{Op: "publish", Key: tg.final, Err: store.ErrTempKeyLost},
			"nil":           nil,
		} {
			published, err := s.Settle(ctx, perr, []*store.Lock{lock})
			if published || err != perr {
				t.Errorf("%s: Settle = %v, %v; want false and the same error", name, published, err)
			}
		}
		wantLock(t, tg.other, lock.Key, lock.Token)
		// Unfenced: nothing can stop a script in flight, so nothing to settle.
		if published, err := s.Settle(ctx, errLostReply, nil); published || err != errLostReply {
			t.Errorf("unfenced: Settle = %v, %v; want false and the same error", published, err)
		}
	})
}
