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

func TestScanSource(t *testing.T) {
	for _, tc := range []struct {
		name, index string
		args        []string
	}{
		{"embedded", "scan-source:users:by-email", nil},
		{"standalone", "scan-source:users:by-email", []string{"-redis", "redis://" + env.Standalone.Addr}},
		{"cluster", "{scan-source}:users:by-email", []string{"-redis", clusterURL(env.Cluster.Addrs)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("REDIS_URL", "")
			var out bytes.Buffer
			if err := run(context.Background(), append(tc.args, "-objects", "1500"), &out); err != nil {
				t.Fatalf("run: %v\n%s", err, &out)
			}
			// One batch of the default 2000 items, or more: a batch that
			// waits for FlushInterval (1 s) goes unfilled, as a slow scan
			// on a loaded machine makes it.
			for _, want := range []string{
				"scanned 1500 objects in ",
				tc.index + ": 1500 entries; stale entry for deleted@example.com present: false",
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
