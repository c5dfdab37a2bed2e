package protocol_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
)

// randomOps returns n random ops of the type kind on key, over few entries
// so that later ops overwrite and remove what earlier ones wrote, with
// conditional removals when conditional is set.
func randomOps(rng *rand.Rand, kind, key string, n int, conditional bool) []protocol.Op {
	entry := func() string { return "e" + strconv.Itoa(rng.IntN(12)) }
	value := func() string { return strconv.Itoa(rng.IntN(3)) }
	var ops []protocol.Op
	for range n {
		k := 1 + rng.IntN(3)
		var op protocol.Op
		switch c := rng.IntN(3); {
		case c == 2 && conditional && kind == "hash":
			op.Cmd = "HDELIF"
		case c == 2 && conditional && kind == "zset":
			op.Cmd = "ZREMIF"
		case c >= 1:
			op.Cmd = map[string]string{"hash": "HDEL", "zset": "ZREM", "set": "SREM"}[kind]
		default:
			op.Cmd = map[string]string{"hash": "HSET", "zset": "ZADD", "set": "SADD"}[kind]
		}
		for range k {
			switch op.Cmd {
			case "HSET", "HDELIF":
				op.Args = append(op.Args, entry(), value())
			case "ZADD", "ZREMIF":
				op.Args = append(op.Args, value(), entry())
			default:
				op.Args = append(op.Args, entry())
			}
		}
		op.Key = key
		ops = append(ops, op)
	}
	return ops
}

// contents returns what key holds, as sorted "entry=value" strings.
func contents(t *testing.T, c rueidis.Client, kind, key string) []string {
	t.Helper()
	var out []string
	switch kind {
	case "hash":
		m, err := redistest.Do(t, c, c.B().Hgetall().Key(key).Build()).AsStrMap()
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range m {
			out = append(out, k+"="+v)
		}
	case "zset":
		zs, err := redistest.Do(t, c, c.B().Zrange().Key(key).Min("0").Max("-1").Withscores().Build()).AsZScores()
		if err != nil {
			t.Fatal(err)
		}
		for _, z := range zs {
			out = append(out, fmt.Sprintf("%s=%v", z.Member, z.Score))
		}
	default:
		ms, err := redistest.Do(t, c, c.B().Smembers().Key(key).Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		out = ms
	}
	slices.Sort(out)
	return out
}

func TestReplayCommands(t *testing.T) {
	// C66: ReplayCommands, which a catch-up sends for each key's ops of a round,
	// leaves every key as replaying the ops one by one in order does (the
	// replay script, op after op): random ops over few entries, so that
	// later ops overwrite and remove what earlier ones wrote, on keys that
	// start with entries of their own. Plain ops go as at most two
	// commands, one that removes and one that sets; conditional removals
	// in replay scripts of at most ReplayScriptWork work each.
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range 60 {
			kind := []string{"hash", "zset", "set"}[i%3]
			conditional := i%2 == 1 && kind != "set"
			n := 1 + rng.IntN(300)
			t.Run(fmt.Sprintf("%d-%s-%d-ops-conditional=%v", i, kind, n, conditional), func(t *testing.T) {
				p := casePrefix(t, d.Other, d.Prefix)
				want, got := p+"want", p+"got"
				for _, k := range []string{want, got} {
					seed := map[string][]string{"hash": {"HSET", k, "e1", "0", "e2", "1", "other", "x"},
						"zset": {"ZADD", k, "0", "e1", "1", "e2", "5", "other"}, "set": {"SADD", k, "e1", "other"}}[kind]
					cmds(t, d.Other, seed)
				}
				ops := randomOps(rng, kind, "live", n, conditional)
				for _, op := range ops {
					redistest.Do(t, d.Client, protocol.ReplayCommand(d.Client.B(), []string{want}, []protocol.Op{op}, []int{0}))
				}
				cs := protocol.ReplayCommands(d.Client.B(), nil, got, ops)
				plain := 0
				for _, c := range cs {
					if c.Commands()[0] == "EVAL" {
						// Per op: its key's index, the command, the count
						// of args, the args: at most twice its work.
						if args := len(c.Commands()) - 4; args > 2*protocol.ReplayScriptWork {
							t.Errorf("a replay script of %d arguments", args)
						}
						continue
					}
					plain++
					if c.Commands()[1] != got {
						t.Errorf("%v writes %q, want %q", c.Commands()[:2], c.Commands()[1], got)
					}
				}
				if !conditional && plain > 2 {
					t.Errorf("%d commands for %d plain ops, want at most 2", plain, n)
				}
				for _, c := range cs {
					redistest.Do(t, d.Client, c)
				}
				if diff := cmp.Diff(contents(t, d.Other, kind, want), contents(t, d.Other, kind, got)); diff != "" {
					t.Errorf("ReplayCommands left %s other than the ops one by one (-want +got):\n%s", kind, diff)
				}
			})
		}
	})
}
