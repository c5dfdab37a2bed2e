package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/capture/pgtest"
	"github.com/keyswap/keyswap/internal/redistest"
)

var (
	env *redistest.Env
	pg  *pgtest.Server
)

func TestMain(m *testing.M) {
	os.Exit(pgtest.Main(&pg, func() int { return redistest.Main(m, &env, false) }))
}

func TestPostgresCDC(t *testing.T) {
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
			args := append(tc.args, "-pg", pg.Database(t), "-users", "5000", "-changes", "1000")
			if err := run(context.Background(), args, &out); err != nil {
				t.Fatalf("run: %v\n%s", err, &out)
			}
			for _, want := range []string{
				"rebuilt the index from 5000 users",
				"rebuilt again while the writer made 1000 changes",
				"index vs table: 0 lost, 0 stale",
			} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, &out)
				}
			}
		})
	}
}

func TestPostgresCDCNeedsPostgres(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	err := run(context.Background(), nil, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "no PostgreSQL: pass -pg") {
		t.Fatalf("run without -pg: %v", err)
	}
}
