package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/examples/internal/cli"
	"github.com/keyswap/keyswap/internal/redistest"
)

var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }

// TestGenerations runs the example as a newcomer would (embedded Redis, no
// flags, so no client-side caching) and against real servers (with it),
// and checks what it prints: the program verifies every generation it
// reads against the users itself, and the concurrent reader's counts must
// be zero.
func TestGenerations(t *testing.T) {
	clusterURL := "redis://" + env.Cluster.Addrs[0] + "?addr=" + strings.Join(env.Cluster.Addrs[1:], "&addr=")
	for _, tc := range []struct {
		name, base string
		args       []string
		cached     bool
	}{
		{"embedded", "gens:users:by-country", nil, false},
		{"standalone", "gens:users:by-country", []string{"-redis", "redis://" + env.Standalone.Addr}, true},
		{"cluster", "{gens:users:by-country}", []string{"-redis", clusterURL}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("REDIS_URL", "") // never a server someone else runs
			var stdout, stderr bytes.Buffer
			if err := run(context.Background(), append(tc.args, "-users", "5000"), &stdout, &stderr); err != nil {
				t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
			}
			out := strings.Join(strings.Fields(stdout.String()), " ") // column widths vary with the keys
			wants := []string{
				"before any run: no pointer, so the reader reads the plain keys (gens:users:by-country:fr, ...): 0 users in fr",
				"1. yesterday's run wrote 5000 users into generation 1 and flipped the pointer to it (the first flip creates the pointer)",
				"GET " + tc.base + ":rebuild-ptr 1",
				"HGETALL " + tc.base + ":rebuild-gens 1=current next=1",
				"the reader caches the pointer client-side: " + map[bool]string{false: "false", true: "true"}[tc.cached],
				"2. today's run wrote 5000 users into generation 2 and flipped the pointer to it; generation 1 stays, as the previous one",
				"GET " + tc.base + ":rebuild-ptr 2",
				"HGETALL " + tc.base + ":rebuild-gens 1=previous 2=current next=2",
				"read gen 1 gen 2",
				"SISMEMBER fr u00014 false true",
				"SCARD br 1000 0",
				"SCARD fr 1000 1572",
				"bucket fr read at gens:users:by-country:rebuild-g:1:fr, then at gens:users:by-country:rebuild-g:2:fr",
				"3. rolled back: the pointer names generation 1 again, and generation 2 is the previous one",
				"HGETALL " + tc.base + ":rebuild-gens 1=current 2=previous next=2",
				"the reader reads gens:users:by-country:rebuild-g:1:br: 1000 users in br, as yesterday",
				"rolled forward: the pointer names generation 2",
				"during the run and the flips: 0 times one was missing, 0 times half-built",
				"verified: generation 2 matches today's 5000 users exactly",
			}
			if tc.name == "cluster" {
				wants = append(wants, "on this cluster the 4 buckets of generation 2 are in 4 hash slots")
			}
			for _, want := range wants {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, &stdout)
				}
			}
			if polls := regexp.MustCompile(`read every bucket (\d+) times`).FindStringSubmatch(out); polls == nil || polls[1] == "0" {
				t.Errorf("the concurrent reader did not read: %v", polls)
			}
		})
	}
}

// TestGenerationsHelp checks that -h prints the usage to stdout and is no
// error: the program exits 0.
func TestGenerationsHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-h"}, &stdout, &stderr)
	if code := cli.ExitCode(err); code != 0 {
		t.Errorf("run(-h): exit status %d (%v), want 0", code, err)
	}
	if !strings.HasPrefix(stdout.String(), "Usage: go run ./examples/generations") || stderr.Len() != 0 {
		t.Errorf("run(-h): stdout %q, stderr %q, want the usage on stdout only", &stdout, &stderr)
	}
}
