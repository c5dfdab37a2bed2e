package redistest

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"slices"
	"testing"
	"time"

	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
)

// Timeout bounds every test context from [Ctx]: long enough for a loaded
// 2-core machine, short enough that a hung test fails in minutes.
const Timeout = 60 * time.Second

// Ctx returns a context that ends with tb's test, or after Timeout.
func Ctx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(tb.Context(), Timeout)
	tb.Cleanup(cancel)
	return ctx
}

// Do runs cmd on c and fails tb on any error but a nil reply.
func Do(tb testing.TB, c rueidis.Client, cmd rueidis.Completed) rueidis.RedisResult {
	tb.Helper()
	args := slices.Clone(cmd.Commands())
	r := c.Do(context.Background(), cmd)
	if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
		tb.Fatalf("%q: %v", args, err)
	}
	return r
}

// Cmd runs the command words (its name, one key, then its arguments) on c
// and fails tb on any error but a nil reply.
func Cmd(tb testing.TB, c rueidis.Client, words ...string) rueidis.RedisResult {
	tb.Helper()
	return Do(tb, c, c.B().Arbitrary(words[0]).Keys(words[1]).Args(words[2:]...).Build())
}

// HGetAll returns the fields of the hash key (none when it is absent).
func HGetAll(tb testing.TB, c rueidis.Client, key string) map[string]string {
	tb.Helper()
	m, err := Do(tb, c, c.B().Hgetall().Key(key).Build()).AsStrMap()
	if err != nil {
		tb.Fatalf("HGETALL %s: %v", key, err)
	}
	return m
}

// ZScores returns the members of the sorted set key and their scores.
func ZScores(tb testing.TB, c rueidis.Client, key string) map[string]float64 {
	tb.Helper()
	zs, err := Do(tb, c, c.B().Zrange().Key(key).Min("0").Max("-1").Withscores().Build()).AsZScores()
	if err != nil {
		tb.Fatalf("ZRANGE %s: %v", key, err)
	}
	out := make(map[string]float64, len(zs))
	for _, z := range zs {
		out[z.Member] = z.Score
	}
	return out
}

// SMembers returns the members of the set key, sorted.
func SMembers(tb testing.TB, c rueidis.Client, key string) []string {
	tb.Helper()
	ms, err := Do(tb, c, c.B().Smembers().Key(key).Build()).AsStrSlice()
	if err != nil {
		tb.Fatalf("SMEMBERS %s: %v", key, err)
	}
	slices.Sort(ms)
	return ms
}

// Get returns the string value of key, and whether it exists.
func Get(tb testing.TB, c rueidis.Client, key string) (string, bool) {
	tb.Helper()
	r := Do(tb, c, c.B().Get().Key(key).Build())
	if rueidis.IsRedisNil(r.Error()) {
		return "", false
	}
	v, err := r.ToString()
	if err != nil {
		tb.Fatalf("GET %s: %v", key, err)
	}
	return v, true
}

// PTTL returns key's remaining time to live: a positive duration, or
// Redis's -1 (no expiry) or -2 (no key) as a Duration of -1 or -2.
func PTTL(tb testing.TB, c rueidis.Client, key string) time.Duration {
	tb.Helper()
	n, err := Do(tb, c, c.B().Pttl().Key(key).Build()).AsInt64()
	if err != nil {
		tb.Fatalf("PTTL %s: %v", key, err)
	}
	if n < 0 {
		return time.Duration(n)
	}
	return time.Duration(n) * time.Millisecond
}

// Exists reports whether key exists.
func Exists(tb testing.TB, c rueidis.Client, key string) bool {
	tb.Helper()
	n, err := Do(tb, c, c.B().Exists().Key(key).Build()).AsInt64()
	if err != nil {
		tb.Fatalf("EXISTS %s: %v", key, err)
	}
	return n == 1
}

// Script is one of keyswap's Lua scripts as it goes over the wire.
type Script struct {
	// Name is the script's file name without .lua ("publish").
	Name string
	// Source is the script's text, which EVAL carries.
	Source string
	// SHA1 is the digest EVALSHA carries.
	SHA1 string
}

// ScriptNamed returns keyswap's script name ("lease", "publish", ...), as
// embedded in the library. It panics for an unknown name: a test bug.
func ScriptNamed(name string) Script {
	src := protocol.Source(name)
	sum := sha1.Sum([]byte(src))
	return Script{Name: name, Source: src, SHA1: hex.EncodeToString(sum[:])}
}

// Lua returns s as a rueidis script, to run it directly.
func (s Script) Lua() *rueidis.Lua { return rueidis.NewLuaScript(s.Source) }

// Is reports whether args, a command's arguments (cmd.Commands()), run s
// through EVALSHA or the EVAL fallback.
func (s Script) Is(args []string) bool {
	return len(args) > 1 && (args[0] == "EVALSHA" && args[1] == s.SHA1 || args[0] == "EVAL" && args[1] == s.Source)
}

// Rebuilder returns rebuild.New(c, opts, bs...), and fails tb if New
// refuses the configuration.
func Rebuilder[T any](tb testing.TB, c rueidis.Client, opts rebuild.Options, bs ...index.Builder[T]) *rebuild.Rebuilder[T] {
	tb.Helper()
	r, err := rebuild.New(c, opts, bs...)
	if err != nil {
		tb.Fatalf("rebuild.New: %v", err)
	}
	return r
}
