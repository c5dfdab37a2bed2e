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

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, false)) }

func TestSQLSource(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"embedded", nil},
		{"standalone", []string{"-redis", "redis://" + env.Standalone.Addr}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("REDIS_URL", "")
			var out bytes.Buffer
			if err := run(context.Background(), append(tc.args, "-orders", "8000"), &out); err != nil {
				t.Fatalf("run: %v\n%s", err, &out)
			}
			for _, want := range []string{
				"streamed 8000 rows in 4 batches, published 5 keys",
				"new        SQL  2000  Redis  2000",
				"shipped    SQL  2000  Redis  2000",
				// Ties at 499.5 come in reverse lexicographic order.
				"biggest orders: [999 7999 7499]",
			} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, &out)
				}
			}
		})
	}
}
