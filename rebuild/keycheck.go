package rebuild

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/rueidis"
)

// keySpec is where a command's keys are, as COMMAND INFO gives it: the
// first key's index, the last's (negative: counted from the end), and the
// step between them; or, for a command whose keys move with its
// arguments, ask the server (COMMAND GETKEYS).
type keySpec struct {
	first, last, step int
	movable           bool
	subs              map[string]keySpec // a container command's subcommands, by "name|sub"
}

// keySpecs caches the key specs of the commands builders add, per
// Rebuilder. The common ones are known here; the others are read from the
// server once each.
type keySpecs struct {
	mu    sync.Mutex
	specs map[string]keySpec
}

// knownSpecs are the commands of the builders of package builders, and other
// common writes with one key, first: they need no COMMAND INFO.
var knownSpecs = func() map[string]keySpec {
	m := map[string]keySpec{}
	for _, name := range []string{"hset", "hsetnx", "hmset", "hincrby", "hincrbyfloat", "hdel",
		"zadd", "zincrby", "zrem", "sadd", "srem", "pfadd", "geoadd", "set", "setex", "psetex",
		"setnx", "append", "incr", "incrby", "incrbyfloat", "decr", "decrby", "setbit", "setrange",
		"rpush", "lpush", "rpushx", "lpushx", "xadd", "expire", "pexpire", "persist"} {
		m[name] = keySpec{first: 1, last: 1, step: 1}
	}
	return m
}()

// keysOf returns the keys of the command args, reading its spec from the
// server through client when it is not known yet.
func (k *keySpecs) keysOf(ctx context.Context, client rueidis.Client, args []string) ([]string, error) {
	spec, err := k.spec(ctx, client, strings.ToLower(args[0]))
	if err != nil {
		return nil, err
	}
	if spec.subs != nil && len(args) > 1 {
		sub, ok := spec.subs[strings.ToLower(args[0]+"|"+args[1])]
		if !ok {
			return nil, fmt.Errorf("the server knows no subcommand %s %s", args[0], args[1])
		}
		spec = sub
	}
	if spec.movable {
		ks, err := client.Do(ctx, client.B().CommandGetkeys().Command(args[0]).Arg(args[1:]...).Build()).AsStrSlice()
		if err != nil {
			return nil, fmt.Errorf("COMMAND GETKEYS %s: %w (keyswap cannot tell which keys it writes)", args[0], err)
		}
		return ks, nil
	}
	if spec.first <= 0 {
		return nil, nil
	}
	last := spec.last
	if last < 0 {
		last += len(args)
	}
	var out []string
	for i := spec.first; i <= last && i < len(args); i += max(spec.step, 1) {
		out = append(out, args[i])
	}
	return out, nil
}

// spec returns the spec of the command name.
func (k *keySpecs) spec(ctx context.Context, client rueidis.Client, name string) (keySpec, error) {
	if s, ok := knownSpecs[name]; ok {
		return s, nil
	}
	k.mu.Lock()
	s, ok := k.specs[name]
	k.mu.Unlock()
	if ok {
		return s, nil
	}
	info, err := client.Do(ctx, client.B().CommandInfo().CommandName(name).Build()).ToArray()
	if err != nil {
		return keySpec{}, fmt.Errorf("COMMAND INFO %s: %w (keyswap cannot tell which keys it writes)", name, err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.specs == nil {
		k.specs = map[string]keySpec{}
	}
	// A server may answer for every command (miniredis does): keep them all.
	for _, e := range info {
		if n, sp, ok := parseSpec(e); ok {
			k.specs[n] = sp
		}
	}
	if s, ok := k.specs[name]; ok {
		return s, nil
	}
	return keySpec{}, fmt.Errorf("the server knows no command %q", name)
}

// parseSpec reads one entry of COMMAND INFO: [name, arity, flags, first,
// last, step, ...] and, from Redis 7, subcommands as its 10th element.
func parseSpec(e rueidis.RedisMessage) (string, keySpec, bool) {
	f, err := e.ToArray()
	if err != nil || len(f) < 6 {
		return "", keySpec{}, false
	}
	name, _ := f[0].ToString()
	var s keySpec
	flags, _ := f[2].AsStrSlice()
	for _, fl := range flags {
		if fl == "movablekeys" {
			s.movable = true
		}
	}
	first, _ := f[3].AsInt64()
	last, _ := f[4].AsInt64()
	step, _ := f[5].AsInt64()
	s.first, s.last, s.step = int(first), int(last), int(step)
	if len(f) >= 10 {
		if subs, err := f[9].ToArray(); err == nil && len(subs) > 0 {
			s.subs = map[string]keySpec{}
			for _, sub := range subs {
				if n, sp, ok := parseSpec(sub); ok {
					s.subs[strings.ToLower(n)] = sp
				}
			}
		}
	}
	return strings.ToLower(name), s, true
}

// checkKeys refuses a batch with a command that writes a key other than
// the temp keys its builder got from Commands.Temp, before anything of the
// batch is sent.
func (s *sender) checkKeys(ctx context.Context, b *batch) error {
	own := make([]map[string]bool, len(s.r.owners))
	for _, t := range b.c.touched {
		if own[t.builder] == nil {
			own[t.builder] = map[string]bool{}
		}
		own[t.builder][t.Key] = true
	}
	for i, cmd := range b.c.cmds {
		args := cmd.Commands()
		ks, err := s.r.specs.keysOf(ctx, s.r.redis.Client(), args)
		if err != nil {
			return &Error{Op: "build", Key: s.r.owners[b.c.owners[i]].key, Err: err}
		}
		for _, k := range ks {
			if !own[b.c.owners[i]][k] {
				return &Error{Op: "build", Key: s.r.owners[b.c.owners[i]].key, Err: fmt.Errorf(
					"a command %s writes key %q, which is not one of this run's temp keys for the builder; builders must write only to keys from Commands.Temp", args[0], k)}
			}
		}
	}
	return nil
}
