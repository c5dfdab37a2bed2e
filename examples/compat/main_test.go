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

func TestCompat(t *testing.T) {
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
				"products:by-price: 2500 products; cheapest: [sku-0000 sku-0100 sku-0200]",
				"a builder that deletes the live key is refused: keyswap: build",
				"products:by-price still has 2500 products",
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
