package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }

// TestOnline runs the example as a newcomer would (embedded Redis, no
// flags) and against real servers: the program checks every index against
// the table itself and fails on any difference; the test also wants
// changes to have been applied during the rebuild, and "0 lost".
func TestOnline(t *testing.T) {
	clusterURL := "redis://" + env.Cluster.Addrs[0] + "?addr=" + strings.Join(env.Cluster.Addrs[1:], "&addr=")
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"embedded", nil},
		{"standalone", []string{"-redis", "redis://" + env.Standalone.Addr}},
		{"cluster", []string{"-redis", clusterURL}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("REDIS_URL", "") // never a server someone else runs
			var stdout bytes.Buffer
			if err := run(context.Background(), append(tc.args, "-users", "20000", "-changes", "3000"), &stdout); err != nil {
				t.Fatalf("run: %v\nstdout:\n%s", err, &stdout)
			}
			out := stdout.String()
			m := regexp.MustCompile(`; (\d+) changes applied during the rebuild, replayed (\d+) times`).FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("output lacks the changes applied during the rebuild:\n%s", out)
			}
			during, _ := strconv.Atoi(m[1])
			replayed, _ := strconv.Atoi(m[2])
			if during == 0 || replayed == 0 {
				t.Errorf("%d changes during the rebuild, replayed %d times; want some of each:\n%s", during, replayed, out)
			}
			if !regexp.MustCompile(`checked every entry of every index against the table \(\d+ users, \d+ changes in all\): 0 lost\n`).MatchString(out) {
				t.Errorf("output lacks the check with 0 lost:\n%s", out)
			}
		})
	}
}
