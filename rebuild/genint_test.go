package rebuild_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

// serverMillis returns the server's clock (TIME), in milliseconds.
func serverMillis(t *testing.T, c rueidis.Client) int64 {
	t.Helper()
	clock, err := c.Do(redistest.Ctx(t), c.B().Time().Build()).AsStrSlice()
	if err != nil || len(clock) != 2 {
		t.Fatalf("TIME: %v, %v", clock, err)
	}
	sec, _ := strconv.ParseInt(clock[0], 10, 64)
	usec, _ := strconv.ParseInt(clock[1], 10, 64)
	return sec*1000 + usec/1000
}

func TestGenerationsRetireStampsServerClock(t *testing.T) {
	// C89: the flip stamps the generation it retires with the server's
	// clock, which the sweep measures the grace on.
	forEachDeployment(t, func(t *testing.T, d deployment) {
		ctx := redistest.Ctx(t)
		prefix := genPrefix(d)
		r := genRebuilder(t, d, prefix, rebuild.Options{Grace: -1})
		if _, err := r.Run(ctx, sources.Slice(genUsers(10, 2))); err != nil {
			t.Fatal(err)
		}
		before := serverMillis(t, d.Other)
		if _, err := r.Run(ctx, sources.Slice(genUsers(10, 2))); err != nil {
			t.Fatal(err)
		}
		after := serverMillis(t, d.Other)
		state := redistest.HGetAll(t, d.Other, keys.RegistryKey(prefix, d.Cluster))["1"]
		ms, err := strconv.ParseInt(strings.TrimPrefix(state, keys.RegRetired), 10, 64)
		if !strings.HasPrefix(state, keys.RegRetired) || err != nil || ms < before || ms > after {
			t.Errorf("generation 1 is %q, want retired:<ms> between the server's %d and %d", state, before, after)
		}
	})
}
