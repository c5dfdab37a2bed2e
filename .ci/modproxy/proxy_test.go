package main

import (
	archivezip "archive/zip"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
	"golang.org/x/mod/zip"
)

// writeFiles writes name → contents under dir, creating directories.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, data := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// git runs git in dir with no user or system configuration.
func git(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL="+os.DevNull)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %q: %v\n%s", args, err, out)
	}
}

// testRepo makes a git repository holding the module example.com/Lib
// (upper case, so that its path is escaped in the proxy) with a nested
// module example.com/Lib/sub, and, besides the committed files, an ignored
// file, an untracked one and a committed one since deleted.
func testRepo(t *testing.T) string {
	t.Helper()
	repo := t.TempDir()
	writeFiles(t, repo, map[string]string{
		"go.mod":     "module example.com/Lib\n\ngo 1.25.0\n",
		"lib.go":     "package lib\n\nconst V = \"committed\"\n",
		"gone.go":    "package lib\n",
		".gitignore": "ignored.txt\n",
		"sub/go.mod": "module example.com/Lib/sub\n\ngo 1.25.0\n",
		"sub/sub.go": "package sub\n",
	})
	git(t, repo, "init", "-q")
	git(t, repo, "add", ".")
	git(t, repo, "commit", "-q", "-m", "first")
	writeFiles(t, repo, map[string]string{
		"lib.go":       "package lib\n\nconst V = \"working tree\"\n",
		"untracked.go": "package lib\n",
		"ignored.txt":  "not in the module\n",
	})
	if err := os.Remove(filepath.Join(repo, "gone.go")); err != nil {
		t.Fatal(err)
	}
	return repo
}

// zipNames returns the names in the zip file at name, sorted.
func zipNames(t *testing.T, name string) []string {
	t.Helper()
	r, err := archivezip.OpenReader(name)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var names []string
	for _, f := range r.File {
		names = append(names, f.Name)
	}
	slices.Sort(names)
	return names
}

func TestRunWritesTheProxyLayout(t *testing.T) {
	repo := testRepo(t)
	proxy := t.TempDir()
	var stderr bytes.Buffer
	if err := run([]string{"-o", proxy, "-version", "v0.1.0", repo, filepath.Join(repo, "sub")}, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, &stderr)
	}
	for _, tc := range []struct {
		dir  string // escaped
		path string
		want []string
	}{
		// The root holds the working tree: lib.go as edited, untracked.go,
		// not the ignored file, the deleted one or the nested module.
		{"example.com/!lib", "example.com/Lib", []string{".gitignore", "go.mod", "lib.go", "untracked.go"}},
		{"example.com/!lib/sub", "example.com/Lib/sub", []string{"go.mod", "sub.go"}},
	} {
		t.Run(tc.path, func(t *testing.T) {
			vdir := filepath.Join(proxy, filepath.FromSlash(tc.dir), "@v")
			var want []string
			for _, n := range tc.want {
				want = append(want, tc.path+"@v0.1.0/"+n)
			}
			if got := zipNames(t, filepath.Join(vdir, "v0.1.0.zip")); !slices.Equal(got, want) {
				t.Errorf("zip: got %q, want %q", got, want)
			}
			if got, err := os.ReadFile(filepath.Join(vdir, "list")); err != nil || string(got) != "v0.1.0\n" {
				t.Errorf("list: got %q (%v), want %q", got, err, "v0.1.0\n")
			}
			var inf info
			if data, err := os.ReadFile(filepath.Join(vdir, "v0.1.0.info")); err != nil {
				t.Error(err)
			} else if err := json.Unmarshal(data, &inf); err != nil || inf.Version != "v0.1.0" || inf.Time.IsZero() {
				t.Errorf("info: got %s (%v), want the version and a time", data, err)
			}
			if got, err := os.ReadFile(filepath.Join(vdir, "v0.1.0.mod")); err != nil || !strings.HasPrefix(string(got), "module "+tc.path+"\n") {
				t.Errorf(".mod: got %q (%v), want the module's go.mod", got, err)
			}
		})
	}
}

// TestGoCommandReadsTheProxy has the go command itself download the
// published versions through GOPROXY=file://, which checks the layout and
// the zip format, and compares the hash it records with the zip's.
func TestGoCommandReadsTheProxy(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	repo := testRepo(t)
	proxy := t.TempDir()
	if err := run([]string{"-o", proxy, "-version", "v0.1.0", repo, filepath.Join(repo, "sub")}, io.Discard); err != nil {
		t.Fatal(err)
	}
	gopath := t.TempDir()
	work := t.TempDir()
	cmd := exec.Command(goTool, "mod", "download", "-json", "example.com/Lib@v0.1.0", "example.com/Lib/sub@v0.1.0")
	cmd.Dir = work
	cmd.Env = append(os.Environ(),
		"GOPROXY=file://"+filepath.ToSlash(proxy), "GONOSUMDB=example.com", "GONOPROXY=", "GOPRIVATE=",
		"GOFLAGS=-modcacherw", "GOWORK=off", "GOTOOLCHAIN=local",
		"GOPATH="+gopath, "GOMODCACHE="+filepath.Join(gopath, "pkg", "mod"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download: %v\n%s", err, out)
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	var got []string
	for dec.More() {
		var d struct{ Path, Version, Dir, Zip, Sum, Error string }
		if err := dec.Decode(&d); err != nil {
			t.Fatal(err)
		}
		if d.Error != "" {
			t.Fatalf("go mod download %s: %s", d.Path, d.Error)
		}
		got = append(got, d.Path+"@"+d.Version)
		esc, _ := module.EscapePath(d.Path)
		want, err := dirhash.HashZip(filepath.Join(proxy, filepath.FromSlash(esc), "@v", "v0.1.0.zip"), dirhash.Hash1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Sum != want {
			t.Errorf("%s: the go command's hash %s, want the zip's %s", d.Path, d.Sum, want)
		}
		if d.Path == "example.com/Lib" {
			if src, err := os.ReadFile(filepath.Join(d.Dir, "lib.go")); err != nil || !strings.Contains(string(src), "working tree") {
				t.Errorf("lib.go in the module cache: got %q (%v), want the working tree's", src, err)
			}
		}
	}
	if want := []string{"example.com/Lib@v0.1.0", "example.com/Lib/sub@v0.1.0"}; !slices.Equal(got, want) {
		t.Errorf("downloaded %q, want %q", got, want)
	}
}

func TestPublishKeepsTheListSorted(t *testing.T) {
	dir, proxy := t.TempDir(), t.TempDir()
	writeFiles(t, dir, map[string]string{"go.mod": "module example.com/m\n"})
	info, err := os.Lstat(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	files := []zip.File{diskFile{slash: "go.mod", path: filepath.Join(dir, "go.mod"), info: info}}
	for _, v := range []string{"v0.2.0", "v0.1.0", "v0.10.0", "v0.2.0"} {
		m := mod{Version: module.Version{Path: "example.com/m", Version: v}, GoMod: []byte("module example.com/m\n")}
		if err := publish(proxy, m, files, time.Unix(0, 0)); err != nil {
			t.Fatalf("publish %s: %v", v, err)
		}
	}
	got, err := os.ReadFile(filepath.Join(proxy, "example.com", "m", "@v", "list"))
	if want := "v0.1.0\nv0.2.0\nv0.10.0\n"; err != nil || string(got) != want {
		t.Errorf("list: got %q (%v), want %q", got, err, want)
	}
}

func TestReadModuleRefuses(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"go.mod": "module example.com/m\n\ngo 1.25.0\n"})
	for _, v := range []string{"0.1.0", "v0.1", "v0.1.0+build", "v2.0.0", "latest", ""} {
		if _, err := readModule(dir, v); err == nil {
			t.Errorf("readModule(%q): got no error, want one", v)
		}
	}
	if m, err := readModule(dir, "v1.2.3-rc.1"); err != nil || m.Version.Path != "example.com/m" {
		t.Errorf("readModule(v1.2.3-rc.1): got %+v, %v, want example.com/m", m.Version, err)
	}
	if _, err := readModule(t.TempDir(), "v0.1.0"); err == nil {
		t.Error("readModule of a directory without go.mod: got no error, want one")
	}
	writeFiles(t, dir, map[string]string{"go.mod": "go 1.25.0\n"})
	if _, err := readModule(dir, "v0.1.0"); err == nil {
		t.Error("readModule of a go.mod without a module directive: got no error, want one")
	}
}

func TestRunUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"-o", t.TempDir()}, {"-version", "v0.1.0", "."}, {"-o", t.TempDir(), "-version", "v0.1.0"}} {
		var stderr bytes.Buffer
		if err := run(args, &stderr); err == nil || !strings.Contains(stderr.String(), "Usage: modproxy") {
			t.Errorf("run(%q): got %v and %q, want an error and the usage", args, err, &stderr)
		}
	}
}
