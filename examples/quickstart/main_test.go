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

// TestQuickstart runs the quickstart as a newcomer would (embedded Redis,
// no flags) and against real servers, and checks what it prints: the
// program verifies the published indexes against today's data itself, and
// the reader's counts must be zero.
func TestQuickstart(t *testing.T) {
	clusterURL := "redis://" + env.Cluster.Addrs[0]
	for i, a := range env.Cluster.Addrs {
		if i == 0 {
			clusterURL += "?"
		} else {
			clusterURL += "&"
		}
		clusterURL += "addr=" + a
	}
	for _, tc := range []struct {
		name, prefix string
		args         []string
	}{
		{"embedded", "quickstart:", nil},
		{"standalone", "quickstart:", []string{"-redis", "redis://" + env.Standalone.Addr}},
		{"cluster", "{quickstart}:", []string{"-redis", clusterURL}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("REDIS_URL", "") // never a server someone else runs
			var stdout, stderr bytes.Buffer
			if err := run(context.Background(), append(tc.args, "-users", "20000"), &stdout, &stderr); err != nil {
				t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
			}
			out := stdout.String()
			for _, want := range []string{
				"verified: every index matches today's 18000 users exactly",
				"0 times one was missing, 0 times half-built or mixed",
				"published 7 keys in one atomic step: 18000 users in 9 batches",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			for _, row := range []string{
				regexp.QuoteMeta(tc.prefix+"users:by-country:br") + `\s+3600\s+\(absent\)`,
				regexp.QuoteMeta(tc.prefix+"users:by-country:fr") + `\s+3600\s+6667`,
				regexp.QuoteMeta(tc.prefix+"users:by-email") + `\s+18000\s+16362`,
				regexp.QuoteMeta(tc.prefix+"users:by-score") + `\s+18000\s+18000`,
				`HGET ` + regexp.QuoteMeta(tc.prefix+"users:by-email") + ` user9@old.example\s+u00009\s+\(nil\)`,
				`HGET ` + regexp.QuoteMeta(tc.prefix+"users:by-email") + ` user7@new.example\s+\(nil\)\s+u00007`,
				`SISMEMBER ` + regexp.QuoteMeta(tc.prefix+"users:by-country:fr") + ` u00006\s+false\s+true`,
				`EXISTS ` + regexp.QuoteMeta(tc.prefix+"users:by-country:br") + `\s+1\s+0`,
			} {
				if !regexp.MustCompile(row).MatchString(out) {
					t.Errorf("output lacks a row matching %q:\n%s", row, out)
				}
			}
			// Every command a reader runs names a key the program wrote, in full.
			cmds := regexp.MustCompile(`(?m)^\s+(?:HGET|SISMEMBER|EXISTS) (\S+)`).FindAllStringSubmatch(out, -1)
			if len(cmds) != 7 {
				t.Errorf("got %d commands a reader runs, want 7:\n%s", len(cmds), out)
			}
			for _, c := range cmds {
				if !strings.HasPrefix(c[1], tc.prefix+"users:by-") {
					t.Errorf("a reader runs a command on %q, not a key the program wrote (%susers:by-...)", c[1], tc.prefix)
				}
			}
			if polls := regexp.MustCompile(`polled every index (\d+) times`).FindStringSubmatch(out); polls == nil || polls[1] == "0" {
				t.Errorf("the reader did not poll: %v", polls)
			}
		})
	}
}

func TestQuickstartBadURL(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-redis", "redis://127.0.0.1:1"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("err = %v, want a connection error naming the address", err)
	}
}

// TestQuickstartHelp checks that -h prints the usage to stdout and is no
// error: the program exits 0.
func TestQuickstartHelp(t *testing.T) {
	for _, arg := range []string{"-h", "-help", "--help"} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), []string{arg}, &stdout, &stderr)
		if code := cli.ExitCode(err); code != 0 {
			t.Errorf("run(%s): exit status %d (%v), want 0", arg, code, err)
		}
		if !strings.HasPrefix(stdout.String(), "Usage: go run ./examples/quickstart") || !strings.Contains(stdout.String(), "-users") || stderr.Len() != 0 {
			t.Errorf("run(%s): stdout %q, stderr %q, want the usage on stdout only", arg, &stdout, &stderr)
		}
	}
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-nope"}, &stdout, &stderr)
	if code := cli.ExitCode(err); code != 2 || !strings.HasPrefix(stderr.String(), "flag provided but not defined: -nope\nUsage:") {
		t.Errorf("run(-nope): exit status %d (%v), stderr %q, want 2 and the error with the usage", code, err, &stderr)
	}
}
