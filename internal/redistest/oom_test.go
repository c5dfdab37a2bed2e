package redistest

import (
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"
)

// isOOM reports whether err is Redis's out-of-memory error.
func isOOM(err error) bool {
	re, ok := rueidis.IsRedisErr(err)
	return ok && strings.HasPrefix(re.Error(), "OOM")
}

func TestLimitMemoryFailsALargeWritePartway(t *testing.T) {
	t.Parallel()
	s := startTestServer(t)
	c := s.Client(t)
	ctx := t.Context()
	key := Prefix(t) + "h"

	restore := s.LimitMemory(t, 1<<20)

	// 10 MiB of hash data: 100 HSETs of 1000 fields of about 100 bytes.
	value := strings.Repeat("x", 100)
	hset := func(i int) error {
		b := c.B().Hset().Key(key).FieldValue()
		for j := range 1000 {
			b = b.FieldValue(strconv.Itoa(i*1000+j), value)
		}
		return c.Do(ctx, b.Build()).Error()
	}
	failed := -1
	for i := range 100 {
		if err := hset(i); err != nil {
			if !isOOM(err) {
				t.Fatalf("HSET %d: got %v, want an OOM error", i, err)
			}
			failed = i
			break
		}
	}
	if failed <= 0 {
		t.Fatalf("first failing HSET: got %d, want one partway through the 100", failed)
	}
	n, err := c.Do(ctx, c.B().Hlen().Key(key).Build()).AsInt64()
	if err != nil || n != int64(failed)*1000 {
		t.Fatalf("HLEN: got %d, %v, want the %d fields written before the limit", n, err, failed*1000)
	}

	restore()
	got, err := c.Do(ctx, c.B().ConfigGet().Parameter("maxmemory").Parameter("maxmemory-policy").Build()).AsStrMap()
	if err != nil {
		t.Fatal(err)
	}
	if got["maxmemory"] != "0" || got["maxmemory-policy"] != "noeviction" {
		t.Errorf("config after restore: got %v, want maxmemory 0 and the default policy noeviction", got)
	}
	for i := failed; i < 100; i++ {
		if err := hset(i); err != nil {
			t.Fatalf("HSET %d after restore: %v", i, err)
		}
	}
	restore() // A second call does nothing.
}

func TestLimitMemoryRestoresThePreviousSettings(t *testing.T) {
	t.Parallel()
	s := startTestServer(t, "--maxmemory", "1gb", "--maxmemory-policy", "allkeys-lru")
	c := s.Client(t)
	config := func() map[string]string {
		got, err := c.Do(t.Context(), c.B().ConfigGet().Parameter("maxmemory").Parameter("maxmemory-policy").Build()).AsStrMap()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	t.Run("limited", func(t *testing.T) {
		s.LimitMemory(t, 1<<20) // Restored by the subtest's cleanup.
		if got := config(); got["maxmemory-policy"] != "noeviction" || got["maxmemory"] == "1073741824" {
			t.Errorf("config while limited: got %v, want a low maxmemory and noeviction", got)
		}
	})
	if got := config(); got["maxmemory"] != "1073741824" || got["maxmemory-policy"] != "allkeys-lru" {
		t.Errorf("config after the cleanup: got %v, want maxmemory 1073741824 and allkeys-lru", got)
	}
}

// TestLimitMemoryRefusesOnlyDenyOOMCommands records which commands a full
// server refuses, for the tests that use LimitMemory to fail a rebuild.
func TestLimitMemoryRefusesOnlyDenyOOMCommands(t *testing.T) {
	t.Parallel()
	s := startTestServer(t)
	c := s.Client(t)
	ctx := t.Context()
	p := Prefix(t)
	for _, k := range []string{"a", "b", "h"} {
		if err := c.Do(ctx, c.B().Set().Key(p+k).Value("v").Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	s.LimitMemory(t, -1<<20) // Already over the limit.

	lua := func(src string, keys ...string) rueidis.Completed {
		return c.B().Eval().Script(src).Numkeys(int64(len(keys))).Key(keys...).Build()
	}
	for _, tc := range []struct {
		name string
		cmd  rueidis.Completed
		oom  bool
	}{
		{"SET NX EX (acquire)", c.B().Set().Key(p + "lock").Value("t").Nx().ExSeconds(10).Build(), true},
		{"HSET", c.B().Hset().Key(p+"new").FieldValue().FieldValue("f", "v").Build(), true},
		{"EXPIRE", c.B().Expire().Key(p + "a").Seconds(100).Build(), false},
		{"DEL", c.B().Del().Key(p + "h").Build(), false},
		{"RENAME", c.B().Rename().Key(p + "a").Newkey(p + "c").Build(), false},
		{"script without denyoom commands", lua("redis.call('UNLINK', KEYS[2]); redis.call('RENAME', KEYS[1], KEYS[2]); return redis.call('PERSIST', KEYS[2])", p+"b", p+"c"), false},
		{"script calling SET", lua("return redis.call('SET', KEYS[1], 'v')", p+"d"), true},
		// Once a script has called a write command, Redis lets it finish
		// (scripts are atomic), past the limit.
		{"script calling SET after a write", lua("redis.call('DEL', KEYS[2]); return redis.call('SET', KEYS[1], 'v')", p+"d", p+"zzz"), false},
	} {
		err := c.Do(ctx, tc.cmd).Error()
		if isOOM(err) != tc.oom || (!tc.oom && err != nil) {
			t.Errorf("%s: got %v, want OOM %v", tc.name, err, tc.oom)
		}
	}
}
