package main

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }

func TestCluster(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	url := "redis://" + env.Cluster.Addrs[0] + "?addr=" + strings.Join(env.Cluster.Addrs, "&addr=")
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-redis", url}, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, &out)
	}
	slot := env.Cluster.KeySlot(t, "users")
	for _, want := range []string{
		"with a hash tag, 5 keys were published in one atomic step:",
		"{users}:by-country:fr    slot " + strconv.FormatInt(slot, 10) + "  swapped",
		`keys "users:by-email" (slot`,
		"give them a common hash tag",
		`family prefix "users:by-country" has no hash tag`,
		"users:by-email has 10000 entries",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, &out)
		}
	}
}

func TestNeedsACluster(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	var out bytes.Buffer
	if err := run(context.Background(), nil, &out); err == nil || !strings.Contains(err.Error(), "needs a Redis Cluster") {
		t.Errorf("without -redis: err = %v, want an explanation", err)
	}
	if err := run(context.Background(), []string{"-redis", "redis://" + env.Standalone.Addr}, &out); err == nil || !strings.Contains(err.Error(), "is not a Redis Cluster") {
		t.Errorf("on a standalone server: err = %v, want a refusal", err)
	}
}
