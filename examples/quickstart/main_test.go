package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"

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
				`HGET users:by-email user9@old.example\s+u00009\s+\(nil\)`,
				`HGET users:by-email user7@new.example\s+\(nil\)\s+u00007`,
				`SISMEMBER users:by-country:fr u00006\s+false\s+true`,
				`EXISTS users:by-country:br\s+1\s+0`,
			} {
				if !regexp.MustCompile(row).MatchString(out) {
					t.Errorf("output lacks a row matching %q:\n%s", row, out)
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
