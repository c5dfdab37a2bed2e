package redistest

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/rueidis"
)

// LimitMemory makes s refuse writes once it uses about headroom more bytes:
// it reads used_memory from INFO memory and sets maxmemory to used_memory +
// headroom, with maxmemory-policy noeviction, in one CONFIG SET. Past the
// limit, every command that Redis flags denyoom (SET, HSET, ZADD, SADD, ...)
// fails with an error whose message starts with "OOM", while commands that
// free or only touch memory (DEL, UNLINK, EXPIRE, RENAME) still work. Redis
// checks the limit before each command, so the command that crosses it
// succeeds and the next one fails: a large write fails partway. A script
// fails at its first denyoom command, unless it has already called a write
// command: Redis then lets it finish. A negative headroom makes the server
// full at once.
//
// Call it on a server of the test's own (from [StartServer]), never on a
// shared one such as [Env.Standalone]: the limit applies to every client of
// the server, and parallel tests would fail with it.
//
// LimitMemory returns a function that restores the previous maxmemory and
// maxmemory-policy; it also registers it with tb.Cleanup, so calling it is
// needed only to lift the limit before the test ends. Restoring is done
// once, and skipped when the server has been stopped, killed or restarted
// since (a restarted server starts with its original settings). LimitMemory
// calls tb.Fatal on error; restore reports errors with tb.Error.
func (s *Server) LimitMemory(tb testing.TB, headroom int64) (restore func()) {
	tb.Helper()
	c, err := s.newClient()
	if err != nil {
		tb.Fatalf("redistest: limit memory of %s: connect: %v", s.Addr, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()

	old, err := c.Do(ctx, c.B().ConfigGet().Parameter("maxmemory").Parameter("maxmemory-policy").Build()).AsStrMap()
	if err != nil {
		c.Close()
		tb.Fatalf("redistest: limit memory of %s: CONFIG GET: %v", s.Addr, err)
	}
	used, err := usedMemory(ctx, c)
	if err != nil {
		c.Close()
		tb.Fatalf("redistest: limit memory of %s: %v", s.Addr, err)
	}
	limit := strconv.FormatInt(used+headroom, 10)
	if err := configSet(ctx, c, limit, "noeviction"); err != nil {
		c.Close()
		tb.Fatalf("redistest: limit memory of %s to %s bytes: %v", s.Addr, limit, err)
	}
	pid := s.PID()

	var once sync.Once
	restore = func() {
		once.Do(func() {
			tb.Helper()
			defer c.Close()
			s.mu.Lock()
			same := !s.stopped && s.running() && s.proc.Pid == pid
			s.mu.Unlock()
			if !same {
				return // The process that had the limit is gone.
			}
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			if err := configSet(ctx, c, old["maxmemory"], old["maxmemory-policy"]); err != nil {
				tb.Errorf("redistest: restore the memory limit of %s: %v", s.Addr, err)
			}
		})
	}
	tb.Cleanup(restore)
	return restore
}

// usedMemory returns used_memory from INFO memory.
func usedMemory(ctx context.Context, c rueidis.Client) (int64, error) {
	info, err := Info(ctx, c, "memory")
	if err != nil {
		return 0, err
	}
	v, ok := info["used_memory"]
	if !ok {
		return 0, fmt.Errorf("INFO memory: no used_memory")
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("INFO memory: used_memory %q: %w", v, err)
	}
	return n, nil
}

// configSet sets maxmemory and maxmemory-policy in one CONFIG SET.
func configSet(ctx context.Context, c rueidis.Client, maxmemory, policy string) error {
	cmd := c.B().ConfigSet().ParameterValue().
		ParameterValue("maxmemory-policy", policy).
		ParameterValue("maxmemory", maxmemory).
		Build()
	if err := c.Do(ctx, cmd).Error(); err != nil {
		return fmt.Errorf("CONFIG SET maxmemory %s maxmemory-policy %s: %w", maxmemory, policy, err)
	}
	return nil
}
