package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// settleRebuild runs a WithRebuild of tg.live with new contents through a
// client whose publish script is handled by onPublish, and returns its
// error. onRelease, when set, handles the release script.
func settleRebuild(t *testing.T, tg target, onPublish, onRelease func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult) error {
	t.Helper()
	c := rueidishook.WithHook(tg.client, redistest.Hook{OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
		switch {
		case isScript(cmd, "publish") && onPublish != nil:
			return onPublish(c, ctx, cmd)
		case isScript(cmd, "release") && onRelease != nil:
			return onRelease(c, ctx, cmd)
		}
		return c.Do(ctx, cmd)
	}})
	s := store.New(c, store.Options{})
	return s.WithRebuild(redistest.Ctx(t), tg.live, store.RebuildOptions{TTL: 60 * time.Second, PreserveFor: 120 * time.Second},
		func(ctx context.Context, temp string, touch func(context.Context) error) error {
			return tg.client.Do(ctx, tg.client.B().Hset().Key(temp).FieldValue().FieldValue("f", "new").Build()).Error()
		})
}

// errLostReply is the error a dropped connection gives after the command left.
var errLostReply = fmt.Errorf("read tcp: %w", context.DeadlineExceeded)

func TestSettleLostReplyAfterThePublishRan(t *testing.T) {
	// C59: the publish script ran, its reply was lost: WithRebuild finds out
	// from the receipt and reports the publish it made, instead of a
	// failure that is not one.
	forEachTarget(t, func(t *testing.T, tg target) {
		redistest.SeedHash(t, tg.other, tg.live, map[string]string{"f": "old"})
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
		redistest.WantHash(t, tg.other, tg.live, map[string]string{"f": "new"})
		s := store.New(tg.client, store.Options{})
		redistest.WantString(t, tg.other, s.LockKey(tg.live), "")
		redistest.WantAbsent(t, tg.other, s.LockKey(tg.live)+":done") // read, then deleted by the release
	})
}

func TestSettleLostReplyBeforeThePublishRan(t *testing.T) {
	// C59: the publish script never left: no receipt, so WithRebuild reports the
	// error, and the live key is the old one. The temp key is kept for
	// PreserveFor (C29).
	forEachTarget(t, func(t *testing.T, tg target) {
		redistest.SeedHash(t, tg.other, tg.live, map[string]string{"f": "old"})
		var temp string
		err := settleRebuild(t, tg, func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			args := cmd.Commands()
			temp = args[5] // EVALSHA sha numkeys lock receipt temp ...
			return rueidis.NewErrorResult(errLostReply)
		}, nil)
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, store.ErrOutcomeUnknown) {
			t.Fatalf("WithRebuild = %v, want the lost reply's error, not ErrOutcomeUnknown", err)
		}
		redistest.WantHash(t, tg.other, tg.live, map[string]string{"f": "old"})
		redistest.WantTTL(t, tg.other, temp, 120*time.Second)
		if got := redistest.PTTL(t, tg.other, temp); got <= 60*time.Second {
			t.Errorf("temp PTTL %v, want PreserveFor (120 s), not the lease", got)
		}
		redistest.WantString(t, tg.other, store.New(tg.client, store.Options{}).LockKey(tg.live), "")
	})
}

func TestSettleUnreachable(t *testing.T) {
	// C59: the reply was lost and the release that would settle it fails
	// too: the outcome is unknown, and the error says so while still matching
	// the original cause. The live key is old or new, never partial.
	forEachTarget(t, func(t *testing.T, tg target) {
		redistest.SeedHash(t, tg.other, tg.live, map[string]string{"f": "old"})
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
		if !strings.Contains(err.Error(), tg.live) {
			t.Errorf("error %q does not name the live key", err)
		}
		if releases.Load() == 0 {
			t.Error("no release was attempted")
		}
		redistest.WantHash(t, tg.other, tg.live, map[string]string{"f": "old"})
		// The lock could not be released: it expires within its TTL.
		redistest.WantTTL(t, tg.other, store.New(tg.client, store.Options{}).LockKey(tg.live), 60*time.Second)
		redistest.Cmd(t, tg.other, "DEL", store.New(tg.client, store.Options{}).LockKey(tg.live))
	})
}
