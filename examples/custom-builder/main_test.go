package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }

func TestCustomBuilder(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"embedded", nil},
		{"standalone", []string{"-redis", "redis://" + env.Standalone.Addr}},
		{"cluster", []string{"-redis", clusterURL(env.Cluster.Addrs)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("REDIS_URL", "")
			var out bytes.Buffer
			if err := run(context.Background(), tc.args, &out); err != nil {
				t.Fatalf("run: %v\n%s", err, &out)
			}
			for _, want := range []string{
				"stores within 5 km of Paris centre: [orsay louvre]",
				"unique visitors (HyperLogLog estimate): about 1",
			} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, &out)
				}
			}
		})
	}
}

func clusterURL(addrs []string) string {
	u := "redis://" + addrs[0] + "?addr=" + strings.Join(addrs, "&addr=")
	return u
}
