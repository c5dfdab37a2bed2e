package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionString(t *testing.T) {
	installed := &debug.BuildInfo{Main: debug.Module{Path: "github.com/keyswap/keyswap/cmd/keyswap", Version: "v1.2.3"}}
	checkout := &debug.BuildInfo{Main: debug.Module{Path: "github.com/keyswap/keyswap/cmd/keyswap", Version: "(devel)"}}
	for _, tc := range []struct {
		override string
		info     *debug.BuildInfo
		ok       bool
		want     string
	}{
		{"", installed, true, "v1.2.3"},       // go install ...@v1.2.3
		{"", checkout, true, "(devel)"},       // go build in a checkout
		{"v2.0.0", installed, true, "v2.0.0"}, // -ldflags "-X main.version=v2.0.0" wins
		{"", &debug.BuildInfo{}, true, "(devel)"},
		{"", nil, false, "(devel)"}, // built without module information
	} {
		if got := versionString(tc.override, tc.info, tc.ok); got != tc.want {
			t.Errorf("versionString(%q, %+v, %v): got %q, want %q", tc.override, tc.info, tc.ok, got, tc.want)
		}
	}
}

// TestVersion asks the in-process CLI for its version in the three ways.
func TestVersion(t *testing.T) {
	info, ok := debug.ReadBuildInfo()
	want := "keyswap " + versionString(version, info, ok) + "\n"
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		r := keyswap(t, args...)
		r.wantCode(t, exitOK)
		if r.stdout != want || r.stderr != "" {
			t.Errorf("keyswap %q: got stdout %q, stderr %q, want %q and none", args, r.stdout, r.stderr, want)
		}
	}
	r := keyswap(t, "version", "extra")
	r.wantCode(t, exitUsage)
}

// TestVersionBinary builds the program twice, plain and with the version
// set at link time, and runs both: the plain one prints the main module's
// version that the toolchain recorded (go version -m), the other the
// version given.
func TestVersionBinary(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the program: %v", err)
	}
	dir := t.TempDir()
	build := func(name string, flags ...string) string {
		t.Helper()
		bin := filepath.Join(dir, name)
		out, err := exec.Command(goTool, append(append([]string{"build", "-o", bin}, flags...), ".")...).CombinedOutput()
		if err != nil {
			t.Fatalf("go build %q: %v\n%s", flags, err, out)
		}
		return bin
	}
	runBin := func(bin string, args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, args...).Output()
		if err != nil {
			t.Fatalf("%s %q: %v", bin, args, err)
		}
		return string(out)
	}

	plain := build("keyswap")
	out, err := exec.Command(goTool, "version", "-m", plain).Output()
	if err != nil {
		t.Fatalf("go version -m: %v", err)
	}
	var recorded string
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "mod" && f[1] == "github.com/keyswap/keyswap/cmd/keyswap" {
			recorded = f[2]
		}
	}
	if recorded == "" {
		t.Fatalf("go version -m records no main module version:\n%s", out)
	}
	if got, want := runBin(plain, "--version"), "keyswap "+recorded+"\n"; got != want {
		t.Errorf("plain build: got %q, want %q", got, want)
	}

	stamped := build("keyswap-stamped", "-ldflags", "-X main.version=v9.8.7")
	for _, args := range [][]string{{"--version"}, {"version"}} {
		if got, want := runBin(stamped, args...), "keyswap v9.8.7\n"; got != want {
			t.Errorf("-X main.version=v9.8.7, keyswap %q: got %q, want %q", args, got, want)
		}
	}
}

// TestVersionJSON prints the version as a JSON object.
func TestVersionJSON(t *testing.T) {
	r := keyswap(t, "version", "-json")
	r.wantCode(t, exitOK)
	var got struct{ Version string }
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.Version == "" {
		t.Errorf("version -json: got %q (%v), want {\"version\": ...}", r.stdout, err)
	}
	if plain := keyswap(t, "version"); plain.stdout != "keyswap "+got.Version+"\n" {
		t.Errorf("version: got %q, want the version of -json, %q", plain.stdout, got.Version)
	}
}
