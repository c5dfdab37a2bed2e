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

// TestSafePublish runs the example on the embedded server and on real
// ones; the program checks the index after each step itself, and the test
// checks what it prints.
func TestSafePublish(t *testing.T) {
	clusterURL := "redis://" + env.Cluster.Addrs[0] + "?addr=" + strings.Join(env.Cluster.Addrs[1:], "&addr=")
	for _, tc := range []struct {
		name, prefix string
		args         []string
	}{
		{"embedded", "safe:", nil},
		{"standalone", "safe:", []string{"-redis", "redis://" + env.Standalone.Addr}},
		{"cluster", "{safe}:", []string{"-redis", clusterURL}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("REDIS_URL", "")
			var out bytes.Buffer
			if err := run(context.Background(), tc.args, &out); err != nil {
				t.Fatalf("run: %v\n%s", err, &out)
			}
			for _, want := range []string{
				"would go from 200 entries to none (RefuseEmpty)",
				tc.prefix + "products:by-name          200 entries live,  180 new",
				"diff " + tc.prefix + "products:by-name     18 added, 38 removed, 0 changed (exact: true)",
				"diff " + tc.prefix + "products:by-price     0 added, 20 removed, 26 changed (exact: true)",
				"published: generation 2",
				"rolled back: generation 1, 200 products",
				"rolled forward: generation 2, 180 products",
			} {
				// Column widths vary with the prefix: compare words.
				if !strings.Contains(strings.Join(strings.Fields(out.String()), " "), strings.Join(strings.Fields(want), " ")) {
					t.Errorf("output lacks %q:\n%s", want, &out)
				}
			}
		})
	}
}
