package redistest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/rueidis"
)

// getOrNil returns the value of key, or "" and false when it is missing.
func getOrNil(t *testing.T, c rueidis.Client, key string) (string, bool) {
	t.Helper()
	v, err := c.Do(t.Context(), c.B().Get().Key(key).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", false
	}
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	return v, true
}

// TestRestartLoadsTheRDBOfSave checks that the default arguments, with --save
// "", only disable automatic snapshots: an explicit SAVE writes dump.rdb, and
// Restart loads it.
func TestRestartLoadsTheRDBOfSave(t *testing.T) {
	t.Parallel()
	s := startTestServer(t)
	c := s.Client(t)
	ctx := t.Context()
	before, after := Prefix(t)+"before", Prefix(t)+"after"
	if err := c.Do(ctx, c.B().Set().Key(before).Value("saved").Build()).Error(); err != nil {
		t.Fatalf("SET %s: %v", before, err)
	}
	if err := c.Do(ctx, c.B().Save().Build()).Error(); err != nil {
		t.Fatalf("SAVE: %v", err)
	}
	if err := c.Do(ctx, c.B().Set().Key(after).Value("unsaved").Build()).Error(); err != nil {
		t.Fatalf("SET %s: %v", after, err)
	}
	if err := s.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if err := s.Restart(); err != nil {
		t.Fatalf("Restart: %v", err)
	}

	eventually(t, "PING after Restart", pingCmd(c))
	if got, ok := getOrNil(t, c, before); !ok || got != "saved" {
		t.Errorf("GET %s, written before SAVE: got %q, %v, want \"saved\"", before, got, ok)
	}
	if got, ok := getOrNil(t, c, after); ok {
		t.Errorf("GET %s, written after SAVE: got %q, want no key", after, got)
	}
}

// TestRestartReplaysTheAOFAlways kills a server with --appendfsync always
// while writers are busy, and checks that every write it acknowledged
// survives the restart.
func TestRestartReplaysTheAOFAlways(t *testing.T) {
	t.Parallel()
	s := startTestServer(t, "--appendonly", "yes", "--appendfsync", "always")
	c := s.Client(t)
	prefix := Prefix(t)

	const writers, enough = 4, 1000
	acked := make([]int, writers) // writer i's keys 0..acked[i]-1 were acknowledged
	var total atomic.Int64
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			for j := 0; ; j++ {
				key := fmt.Sprintf("%s%d:%d", prefix, i, j)
				if err := c.Do(context.Background(), c.B().Set().Key(key).Value("v").Build()).Error(); err != nil {
					return // The kill, or the test's end.
				}
				acked[i] = j + 1
				total.Add(1)
			}
		})
	}
	eventually(t, "the writers write", func(context.Context) error {
		if n := total.Load(); n < enough {
			return fmt.Errorf("acknowledged writes: got %d, want >= %d", n, enough)
		}
		return nil
	})
	if err := s.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	wg.Wait()
	if err := s.Restart(); err != nil {
		t.Fatalf("Restart: %v", err)
	}

	eventually(t, "PING after Restart", pingCmd(c))
	for i, n := range acked {
		for j := range n {
			if key := fmt.Sprintf("%s%d:%d", prefix, i, j); !exists(t, c, key) {
				t.Fatalf("GET %s, acknowledged before the kill: got no key, want it replayed from the AOF", key)
			}
		}
	}
}

// exists reports whether key exists.
func exists(t *testing.T, c rueidis.Client, key string) bool {
	t.Helper()
	_, ok := getOrNil(t, c, key)
	return ok
}
