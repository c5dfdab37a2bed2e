package redistest

import (
	"context"
	"time"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"
)

// Hook is a rueidishook.Hook that passes every call through, except those
// its non-nil fields intercept. Wrap a client with
// rueidishook.WithHook(client, redistest.Hook{...}) to fail, delay or
// observe one specific command.
//
// rueidis recycles a command once it has been sent: copy cmd.Commands()
// (slices.Clone) before passing the command on if you read it afterwards.
type Hook struct {
	// OnDo intercepts Do. Call c.Do(ctx, cmd) to pass the command on.
	OnDo func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult
	// OnDoMulti intercepts DoMulti. Call c.DoMulti(ctx, multi...) to pass
	// the commands on.
	OnDoMulti func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult
}

var _ rueidishook.Hook = Hook{}

// Do calls OnDo, or passes cmd on.
func (h Hook) Do(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if h.OnDo != nil {
		return h.OnDo(c, ctx, cmd)
	}
	return c.Do(ctx, cmd)
}

// DoMulti calls OnDoMulti, or passes multi on.
func (h Hook) DoMulti(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	if h.OnDoMulti != nil {
		return h.OnDoMulti(c, ctx, multi...)
	}
	return c.DoMulti(ctx, multi...)
}

// DoCache passes cmd on.
func (Hook) DoCache(c rueidis.Client, ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	return c.DoCache(ctx, cmd, ttl)
}

// DoMultiCache passes multi on.
func (Hook) DoMultiCache(c rueidis.Client, ctx context.Context, multi ...rueidis.CacheableTTL) []rueidis.RedisResult {
	return c.DoMultiCache(ctx, multi...)
}

// Receive passes sub on.
func (Hook) Receive(c rueidis.Client, ctx context.Context, sub rueidis.Completed, fn func(rueidis.PubSubMessage)) error {
	return c.Receive(ctx, sub, fn)
}

// DoStream passes cmd on.
func (Hook) DoStream(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResultStream {
	return c.DoStream(ctx, cmd)
}

// DoMultiStream passes multi on.
func (Hook) DoMultiStream(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) rueidis.MultiRedisResultStream {
	return c.DoMultiStream(ctx, multi...)
}

// Watch returns c with a hook that passes every command of Do and DoMulti
// to see before sending it on, from the caller's goroutine: see must be
// safe for concurrent use, and must copy what it keeps of a command (see
// Hook).
func Watch(c rueidis.Client, see func(cmds ...rueidis.Completed)) rueidis.Client {
	return rueidishook.WithHook(c, Hook{
		OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
			see(cmd)
			return c.Do(ctx, cmd)
		},
		OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
			see(multi...)
			return c.DoMulti(ctx, multi...)
		},
	})
}
