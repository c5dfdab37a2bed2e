package doccheck

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// root returns the repository's root directory: this package is
// examples/internal/doccheck.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.work")); err != nil {
		t.Fatalf("the repository's root %s has no go.work: %v", dir, err)
	}
	return dir
}

// documents returns README.md and docs/*.md, relative to root.
func documents(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, d := range docs {
		out = append(out, filepath.Join("docs", filepath.Base(d)))
	}
	if len(out) < 2 {
		t.Fatalf("no document in %s/docs", root)
	}
	return out
}

// block is one ```go block of a document.
type block struct {
	doc  string // the document, relative to the root
	line int    // the line of the first line of code, from 1
	code string
	skip string // why it is not built, from its doccheck comment; "" to build it
}

// skipComment is the comment that exempts the next block from the build.
var skipComment = regexp.MustCompile(`^<!--\s*doccheck:\s*skip:\s*(.*?)\s*-->$`)

// goBlocks returns the ```go blocks of the document doc, whose text is
// text. A fenced block may be indented (in a list): the fence's
// indentation is removed from its lines.
func goBlocks(t *testing.T, doc, text string) []block {
	t.Helper()
	var (
		out    []block
		cur    *block
		indent string
		lines  []string
		prev   string // the last non-blank line before the fence
	)
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			if strings.TrimPrefix(trimmed, "```") == "go" {
				cur = &block{doc: doc, line: n + 1}
				indent = line[:len(line)-len(strings.TrimLeft(line, " \t"))]
				if m := skipComment.FindStringSubmatch(prev); m != nil {
					if m[1] == "" {
						t.Errorf("%s:%d: a doccheck skip comment without a reason", doc, n-1)
					}
					cur.skip = m[1]
				}
				lines = nil
				continue
			}
			// Another language's block: skip to its end.
			cur = &block{doc: ""}
		case cur != nil && trimmed == "```":
			if cur.doc != "" {
				cur.code = strings.Join(lines, "\n") + "\n"
				out = append(out, *cur)
			}
			cur = nil
		case cur != nil:
			lines = append(lines, strings.TrimPrefix(line, indent))
		}
		if trimmed != "" {
			prev = trimmed
		}
	}
	if cur != nil {
		t.Errorf("%s: a ``` block is not closed", doc)
	}
	return out
}

// scaffold is the file around a fragment: %s is where the top-level
// declarations go, and the body of fragment, %s, goes after it.
const scaffold = `package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"log"
	"os"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/capture/pgcdc"
	"github.com/keyswap/keyswap/goredis"
	"github.com/keyswap/keyswap/guards"
	"github.com/keyswap/keyswap/index"
	keyswapotel "github.com/keyswap/keyswap/otel"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/keyswap/keyswap/store"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidiscompat"
)

// The packages that a fragment may use without importing them.
var (
	_ = context.Background
	_ = sql.Open
	_ = errors.Is
	_ = fmt.Sprint
	_ = iter.Pull[int]
	_ = log.Print
	_ = os.Getenv
	_ = time.Second
	_ = builders.Blank
	_ = pgcdc.New[User]
	_ = goredis.ClientOption
	_ = keyswapotel.New
	_ = guards.RefuseEmpty
	_ = index.Insert[User]
	_ = rebuild.New[User]
	_ = sources.Slice[User]
	_ = store.New
	_ = redis.ParseURL
	_ = rueidis.NewClient
	_ = rueidiscompat.Nil
)

// The names that fragments use without declaring them.
type User struct {
	ID, Email, Country string
	Score              float64
}

type Store struct {
	Name     string
	Lon, Lat float64
}

var (
	ctx                       context.Context
	client                    rueidis.Client
	users                     []User
	emails, scores, countries index.Builder[User]
	r                         *rebuild.Rebuilder[User]
	oldUser, newUser          User
	dsn                       string
	userFromRow               func(pgcdc.Row) (User, error)
)

func main() {}

%s

func fragment() error {
%s
	return nil
}
`

// declaration reports whether a fragment starts with a top-level
// declaration rather than a statement.
func declaration(code string) bool {
	for line := range strings.SplitSeq(code, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "//") {
			continue
		}
		for _, kw := range []string{"type ", "func ", "var ", "const "} {
			if strings.HasPrefix(line, kw) {
				return true
			}
		}
		return false
	}
	return false
}

// source returns the file that builds b, with //line directives that make
// the compiler report the document's lines.
func (b block) source(root string) string {
	at := fmt.Sprintf("//line %s:%d\n", filepath.Join(root, b.doc), b.line)
	switch {
	case strings.HasPrefix(strings.TrimSpace(b.code), "package "):
		return at + b.code
	case declaration(b.code):
		return fmt.Sprintf(scaffold, at+b.code, "")
	}
	return fmt.Sprintf(scaffold, "", at+b.code)
}

// goBuild runs go build with args in the examples module, with the files
// of overlay (a path in the module → its contents) laid over it, and
// returns its output on failure.
func goBuild(t *testing.T, root string, overlay map[string]string, args ...string) error {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the documents' code: %v", err)
	}
	dir := t.TempDir()
	replace := map[string]string{}
	i := 0
	for path, code := range overlay {
		i++
		file := filepath.Join(dir, fmt.Sprintf("f%03d.go", i))
		if err := os.WriteFile(file, []byte(code), 0o600); err != nil {
			t.Fatal(err)
		}
		replace[path] = file
	}
	js, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		t.Fatal(err)
	}
	overlayFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayFile, js, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goTool, append([]string{"build", "-overlay", overlayFile}, args...)...)
	cmd.Dir = filepath.Join(root, "examples")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%v\n%s", err, out)
	}
	return nil
}

// TestGoBlocks builds every Go block of the documents: the first block of
// README.md as a program of its own, then all of them together.
func TestGoBlocks(t *testing.T) {
	root := root(t)
	var blocks []block
	for _, doc := range documents(t, root) {
		text, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, goBlocks(t, doc, string(text))...)
	}
	if len(blocks) == 0 || blocks[0].doc != "README.md" {
		t.Fatal("README.md has no Go block")
	}
	first := blocks[0]
	if first.skip != "" || !strings.HasPrefix(strings.TrimSpace(first.code), "package main\n") {
		t.Fatalf("README.md:%d: the first Go block must be a complete program (package main), built as it is", first.line)
	}
	// The packages are directories of the examples module that do not
	// exist: the overlay gives them their one file.
	snippets := filepath.Join(root, "examples", "internal", "doccheck", "snippets")
	pkg := func(i int) string { return fmt.Sprintf("./internal/doccheck/snippets/b%03d", i) }
	file := func(i int) string { return filepath.Join(snippets, fmt.Sprintf("b%03d", i), "main.go") }

	bin := filepath.Join(t.TempDir(), "first")
	if err := goBuild(t, root, map[string]string{file(0): first.source(root)}, "-o", bin, pkg(0)); err != nil {
		t.Fatalf("README.md:%d: the first Go block does not build into a program:\n%v", first.line, err)
	}

	overlay := map[string]string{}
	var pkgs []string
	for i, b := range blocks {
		if b.skip != "" {
			t.Logf("%s:%d: not built: %s", b.doc, b.line, b.skip)
			continue
		}
		overlay[file(i)] = b.source(root)
		pkgs = append(pkgs, pkg(i))
	}
	// With several packages, go build compiles them and discards the
	// result.
	if err := goBuild(t, root, overlay, pkgs...); err != nil {
		t.Errorf("the documents' Go blocks do not build:\n%v", err)
	}
	t.Logf("built %d Go blocks of %d documents", len(pkgs), len(documents(t, root)))
}

// TestGoBlocksFailsOnABrokenBlock checks that a block that does not
// compile fails the build, at the document's line.
func TestGoBlocksFailsOnABrokenBlock(t *testing.T) {
	root := root(t)
	blocks := goBlocks(t, "docs/broken.md", "Text.\n\n```go\nx := rebuild.NoSuchThing\n```\n")
	if len(blocks) != 1 {
		t.Fatalf("got %d blocks, want 1", len(blocks))
	}
	file := filepath.Join(root, "examples", "internal", "doccheck", "snippets", "broken", "main.go")
	err := goBuild(t, root, map[string]string{file: blocks[0].source(root)}, "./internal/doccheck/snippets/broken")
	// The go command gives the file relative to the module's directory.
	if want := "docs/broken.md:4: undefined: rebuild.NoSuchThing"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("go build of a broken block: got %v, want an error %q", err, want)
	}
}

func TestGoBlocksParse(t *testing.T) {
	text := "# T\n\n```sh\nmake test\n```\n\n<!-- doccheck: skip: a placeholder -->\n```go\nx := 1\n```\n\n- a list:\n\n  ```go\n  type T struct{}\n  ```\n"
	got := goBlocks(t, "d.md", text)
	want := []block{
		{doc: "d.md", line: 9, code: "x := 1\n", skip: "a placeholder"},
		{doc: "d.md", line: 15, code: "type T struct{}\n"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("goBlocks:\ngot  %+v\nwant %+v", got, want)
	}
	if !declaration(want[1].code) || declaration(want[0].code) || declaration("// a comment\nr.Run(ctx, src)\n") {
		t.Error("declaration: a type is one, statements are not")
	}
}

// link is a Markdown link: [text](target).
var link = regexp.MustCompile(`\[([^\]]*)\]\(([^)\s]+)\)`)

// testName is the name of a test, benchmark, fuzz target or example.
var testName = regexp.MustCompile("^`?((?:Test|Benchmark|Fuzz|Example)[A-Z0-9_]\\w*)`?$")

// codeTestName finds test names written as code in a document.
var codeTestName = regexp.MustCompile("`((?:Test|Benchmark|Fuzz)[A-Z0-9_]\\w*)`")

// TestLinks checks the relative links of the documents, and the test
// names they give.
func TestLinks(t *testing.T) {
	root := root(t)
	declared := testFuncs(t, root)
	for _, doc := range documents(t, root) {
		text, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(text), "\n") {
			at := fmt.Sprintf("%s:%d", doc, n+1)
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				checkLink(t, root, doc, at, m[1], m[2])
			}
			for _, m := range codeTestName.FindAllStringSubmatch(line, -1) {
				if !declared[m[1]] {
					t.Errorf("%s: %s is no test of the repository", at, m[1])
				}
			}
		}
	}
}

// checkLink checks one link of doc, at a line described by at.
func checkLink(t *testing.T, root, doc, at, text, target string) {
	t.Helper()
	if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return
	}
	path, anchor, _ := strings.Cut(target, "#")
	file := filepath.Join(root, doc)
	if path != "" {
		file = filepath.Join(root, filepath.Dir(doc), filepath.FromSlash(path))
	}
	if rel, err := filepath.Rel(root, file); err != nil || strings.HasPrefix(rel, "..") {
		t.Errorf("%s: %s points outside the repository", at, target)
		return
	}
	info, err := os.Stat(file)
	if err != nil {
		t.Errorf("%s: link %s: %v", at, target, err)
		return
	}
	if anchor != "" {
		if !strings.HasSuffix(file, ".md") || !slices.Contains(anchors(t, file), anchor) {
			t.Errorf("%s: link %s: no heading %q in %s", at, target, anchor, file)
		}
	}
	if m := testName.FindStringSubmatch(text); m != nil && !info.IsDir() {
		code, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^func ` + m[1] + `\(`).Match(code) {
			t.Errorf("%s: link %s: %s is not declared there", at, target, m[1])
		}
	}
}

// anchors returns the anchors GitHub gives the headings of the Markdown
// file: lower case, spaces as hyphens, punctuation other than - and _
// dropped.
func anchors(t *testing.T, file string) []string {
	t.Helper()
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	inCode := false
	for line := range strings.SplitSeq(string(text), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		heading := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(heading) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}

// testFuncs returns the names of the tests, benchmarks, fuzz targets and
// examples declared in the repository's _test.go files.
func testFuncs(t *testing.T, root string) map[string]bool {
	t.Helper()
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz|Example)\w*)\(`)
	names := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		code, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllSubmatch(code, -1) {
			names[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestGoVersion checks that every go.mod and go.work of the repository
// asks for one Go version, the one README.md gives.
func TestGoVersion(t *testing.T) {
	root := root(t)
	goLine := regexp.MustCompile(`(?m)^go (\d+\.\d+)(\.\d+)?$`)
	versions := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		if d.IsDir() || (d.Name() != "go.mod" && d.Name() != "go.work") {
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		m := goLine.FindSubmatch(text)
		if m == nil {
			t.Errorf("%s: no go line", rel)
			return nil
		}
		v := string(m[1]) + string(m[2])
		versions[v] = append(versions[v], rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(versions) != 1 {
		t.Fatalf("go versions: got %v, want one for every go.mod and go.work", versions)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for v := range versions {
		minor := goLine.FindStringSubmatch("go " + v)[1]
		said := regexp.MustCompile(`Go (\d+\.\d+) or later`).FindAllStringSubmatch(string(readme), -1)
		if len(said) == 0 {
			t.Errorf("README.md says no \"Go %s or later\"", minor)
		}
		for _, s := range said {
			if s[1] != minor {
				t.Errorf("README.md says %q, want Go %s, as the go.mod files", s[0], minor)
			}
		}
	}
}
