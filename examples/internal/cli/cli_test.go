package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
)

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{flag.ErrHelp, 0},
		{fmt.Errorf("parsing: %w", flag.ErrHelp), 0},
		{&UsageError{Err: errors.New("flag provided but not defined: -x")}, 2},
		{errors.New("connection refused"), 1},
	} {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("ExitCode(%v): got %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestParse(t *testing.T) {
	newFS := func() *flag.FlagSet {
		fs := flag.NewFlagSet("demo", flag.ContinueOnError)
		fs.Int("users", 10, "how many users")
		return fs
	}
	for _, tc := range []struct {
		args               []string
		code               int
		inStdout, inStderr string
	}{
		{[]string{"-users", "3"}, 0, "", ""},
		{[]string{"-h"}, 0, "how many users", ""},
		{[]string{"--help"}, 0, "how many users", ""},
		{[]string{"-x"}, 2, "", "flag provided but not defined: -x\nUsage of demo:"},
	} {
		var stdout, stderr bytes.Buffer
		err := Parse(newFS(), tc.args, &stdout, &stderr)
		if got := ExitCode(err); got != tc.code {
			t.Errorf("Parse(%q): exit code %d (%v), want %d", tc.args, got, err, tc.code)
		}
		if !strings.Contains(stdout.String(), tc.inStdout) || (tc.inStdout == "") != (stdout.Len() == 0) {
			t.Errorf("Parse(%q): stdout %q, want it to hold %q", tc.args, &stdout, tc.inStdout)
		}
		if !strings.Contains(stderr.String(), tc.inStderr) || (tc.inStderr == "") != (stderr.Len() == 0) {
			t.Errorf("Parse(%q): stderr %q, want it to hold %q", tc.args, &stderr, tc.inStderr)
		}
	}
}
