package protocol

import (
	"crypto/fips140"
	"crypto/sha1"
	"encoding/hex"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// codeUse matches an upper-case identifier in Lua source with comments and
// strings left out, and what follows it, to tell a use from a table key.
var codeUse = regexp.MustCompile(`([.]?)\b([A-Z][A-Z0-9_]*)\b(\s*=?=?)`)

// codeLiteral matches a reply code written as a number: the first element
// of a table constructor, or a status appended to a reply.
var codeLiteral = regexp.MustCompile(`\{\s*-?[0-9]+\s*[,}]|out\[#out \+ 1\] = -?[0-9]+\b`)

// scriptCodes returns the code names the Lua src uses: upper-case
// identifiers, leaving out KEYS, ARGV, one-letter counts and table keys
// (changes.types' command names).
func scriptCodes(src string) []string {
	var out []string
	for _, m := range codeUse.FindAllStringSubmatch(luaNoise.ReplaceAllString(src, ""), -1) {
		name, key := m[2], m[1] == "." || strings.TrimSpace(m[3]) == "="
		if key || len(name) == 1 || name == "KEYS" || name == "ARGV" {
			continue
		}
		out = append(out, name)
	}
	return out
}

func TestScriptsNameTheirCodes(t *testing.T) {
	// Every code a script returns comes from replyCodes, by its name: a
	// name the table lacks, or a number where a name exists, fails here
	// rather than as a reply Go misreads.
	known := map[string]bool{}
	for _, c := range replyCodes {
		if known[c.name] {
			t.Errorf("replyCodes names %s twice", c.name)
		}
		known[c.name] = true
	}
	used := map[string]bool{}
	files := 0
	err := fs.WalkDir(Scripts, "scripts", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		files++
		src := read(path)
		for _, name := range scriptCodes(src) {
			used[name] = true
			if !known[name] {
				t.Errorf("%s uses the code %s, which replyCodes lacks", path, name)
			}
		}
		for _, lit := range codeLiteral.FindAllString(luaNoise.ReplaceAllString(src, ""), -1) {
			t.Errorf("%s writes a reply code as a number, %q: name it (replyCodes)", path, lit)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 10 {
		t.Fatalf("found %d script files", files)
	}
	for _, c := range replyCodes {
		if !used[c.name] {
			t.Errorf("no script returns %s: drop it from replyCodes", c.name)
		}
	}
	if len(used) < 20 {
		t.Errorf("found %d code names in the scripts: the pattern no longer matches them", len(used))
	}
}

func TestGoHandlesEveryCode(t *testing.T) {
	// Each constant of replyCodes is read by a function of this package:
	// a code that Go does not decode is one it would misread.
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var table []string
	read := map[string]bool{}
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				ast.Inspect(d, func(n ast.Node) bool {
					if id, ok := n.(*ast.Ident); ok {
						read[id.Name] = true
					}
					return true
				})
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					v, ok := spec.(*ast.ValueSpec)
					if !ok || len(v.Names) != 1 || v.Names[0].Name != "replyCodes" {
						continue
					}
					for _, e := range v.Values[0].(*ast.CompositeLit).Elts {
						table = append(table, e.(*ast.CompositeLit).Elts[1].(*ast.Ident).Name)
					}
				}
			}
		}
	}
	if len(table) != len(replyCodes) {
		t.Fatalf("found %d constants in replyCodes, want %d", len(table), len(replyCodes))
	}
	for _, name := range table {
		if !read[name] {
			t.Errorf("no function reads %s: Go does not handle the code", name)
		}
	}
}

func TestPreambleDefinesTheCodes(t *testing.T) {
	// The preamble is part of the text sent to Redis, so it is part of
	// the SHA1 that EVALSHA sends.
	src := Source("publish")
	first, _, _ := strings.Cut(src, "\n")
	for _, c := range []struct {
		name  string
		value int64
	}{{"OK", codeOK}, {"BEHIND", codeBehind}, {"TEMP_LOST", codeTempLost}, {"EMPTIED", codeEmptied}} {
		names, values, _ := strings.Cut(strings.TrimPrefix(first, "local "), " = ")
		at := slices.Index(strings.Split(names, ", "), c.name)
		if at < 0 {
			t.Fatalf("the preamble %q does not define %s", first, c.name)
		}
		if got := strings.Split(values, ", ")[at]; got != strconv.FormatInt(c.value, 10) {
			t.Errorf("the preamble defines %s = %s, want %d", c.name, got, c.value)
		}
	}
	if strings.Contains(first, "TEMP_ABSENT") {
		t.Errorf("the preamble %q defines a code publish does not use", first)
	}
	if preamble(Source("readlog")) != "" {
		t.Errorf("readlog uses no code, but gets a preamble")
	}
	if !fips140.Enabled() {
		sum := sha1.Sum([]byte(src))
		if publishScript.sha1 != hex.EncodeToString(sum[:]) || publishScript.src != src {
			t.Errorf("publish is sent as other text than Source(\"publish\")")
		}
	}
}
