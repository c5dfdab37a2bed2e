// Package speccheck checks that the tests name the rules of SPEC.md that
// they check: every live rule is cited by at least one test, and every
// citation in a test names a rule of SPEC.md that is not retired.
//
// A rule is a line "- **C12** ..." (or "**C5+**") of SPEC.md; a rule whose
// text starts with "Retired:" keeps its number but needs no test, and a test
// may not cite it. A citation is a word C12 or C5+ in a *_test.go file of any
// module the repository's go.work uses, and a range C43-C45 (or with an en
// dash) cites every rule of that number in between.
package speccheck

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// root is the repository's root, from this package's directory.
const root = "../.."

var (
	ruleLine = regexp.MustCompile(`^- \*\*(C\d+\+?)\*\*\s*(.*)$`)
	// A citation: C12, C5+, or a range C43-C45 / C43–C45. The letter must
	// not follow a word character, so 0xC1 or ABC12 are no citations.
	citation = regexp.MustCompile(`(?:^|[^\w])(C(\d+)(\+?)(?:\s*[-–]\s*C(\d+)\b)?)`)
	useLine  = regexp.MustCompile(`^\s*(?:use\s+)?(\.[^\s()]*)\s*$`)
)

// rule is one numbered rule of SPEC.md.
type rule struct {
	id      string // "C12" or "C5+"
	retired bool
}

// site is where a test cites a rule.
type site struct {
	file string
	line int
}

func (s site) String() string { return fmt.Sprintf("%s:%d", s.file, s.line) }

// rules parses SPEC.md.
func rules(t *testing.T) map[string]rule {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "SPEC.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]rule{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		m := ruleLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		if _, dup := out[m[1]]; dup {
			t.Errorf("SPEC.md: rule %s is defined twice", m[1])
		}
		out[m[1]] = rule{id: m[1], retired: strings.HasPrefix(m[2], "Retired:")}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) < 2 {
		t.Fatalf("SPEC.md: found %d rules; the rule lines (- **C1** ...) were not recognised", len(out))
	}
	return out
}

// modules returns the directories go.work uses, relative to the root.
func modules(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	inUse := false
	for _, l := range strings.Split(string(b), "\n") {
		l, _, _ = strings.Cut(l, "//")
		trimmed := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(trimmed, "use ("):
			inUse = true
			continue
		case inUse && trimmed == ")":
			inUse = false
			continue
		case !inUse && !strings.HasPrefix(trimmed, "use "):
			continue
		}
		if m := useLine.FindStringSubmatch(trimmed); m != nil {
			dirs = append(dirs, filepath.Clean(m[1]))
		}
	}
	if !slices.Contains(dirs, ".") {
		t.Fatalf("go.work: the root module is not among the modules it uses (%q)", dirs)
	}
	return dirs
}

// citations returns every rule id cited by a test file of the modules, with
// where, skipping this package's own files (they name rules as examples).
func citations(t *testing.T, dirs []string) map[string][]site {
	t.Helper()
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	out := map[string][]site{}
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if name := d.Name(); name == ".git" || name == "testdata" || (strings.HasPrefix(name, ".") && name != "." && path != filepath.Join(root, dir)) {
					return filepath.SkipDir
				}
				if abs, _ := filepath.Abs(path); abs == self {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, "_test.go") {
				return nil
			}
			abs, err := filepath.Abs(path)
			if err != nil || seen[abs] {
				return err
			}
			seen[abs] = true
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			for i, l := range strings.Split(string(b), "\n") {
				for _, id := range cited(l) {
					out[id] = append(out[id], site{rel, i + 1})
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// cited returns the rule ids a line cites.
func cited(line string) []string {
	var ids []string
	for _, m := range citation.FindAllStringSubmatch(line, -1) {
		from, _ := strconv.Atoi(m[2])
		if m[4] == "" {
			ids = append(ids, "C"+m[2]+m[3])
			continue
		}
		to, _ := strconv.Atoi(m[4])
		if m[3] != "" || to < from || to-from > 20 {
			ids = append(ids, m[1]) // not a range we read: reported as unknown
			continue
		}
		for n := from; n <= to; n++ {
			ids = append(ids, "C"+strconv.Itoa(n))
		}
	}
	return ids
}

func TestCited(t *testing.T) {
	for _, c := range []struct {
		line string
		want []string
	}{
		{"// C12", []string{"C12"}},
		{"// TestX: C5+, C16+ and C23.", []string{"C5+", "C16+", "C23"}},
		{"// (C18, C43-C45, C52)", []string{"C18", "C43", "C44", "C45", "C52"}},
		{"// C64–C66", []string{"C64", "C65", "C66"}},
		{`t.Run("C7 held lock", f)`, []string{"C7"}},
		{"0xC1, ABC12, C", nil},
	} {
		if got := cited(c.line); !slices.Equal(got, c.want) {
			t.Errorf("cited(%q) = %q, want %q", c.line, got, c.want)
		}
	}
}

// TestEveryRuleIsCited: every live rule of SPEC.md is cited by a test,
// every citation names a live rule, and no number below the highest is
// missing (a retired rule keeps its number, saying why).
func TestEveryRuleIsCited(t *testing.T) {
	rs := rules(t)
	cs := citations(t, modules(t))

	var uncited []string
	for id, r := range rs {
		if !r.retired && len(cs[id]) == 0 {
			uncited = append(uncited, id)
		}
	}
	slices.SortFunc(uncited, byNumber)
	for _, id := range uncited {
		t.Errorf("rule %s of SPEC.md is cited by no test", id)
	}

	// A number with no rule was dropped silently: say why, or restore it.
	highest := 0
	for id := range rs {
		n, _ := strconv.Atoi(strings.TrimSuffix(id[1:], "+"))
		highest = max(highest, n)
	}
	for n := 1; n <= highest; n++ {
		id := "C" + strconv.Itoa(n)
		if _, ok := rs[id]; !ok {
			if _, plus := rs[id+"+"]; !plus {
				t.Errorf("SPEC.md has no rule %s: restore it, or keep its number with \"- **%s** Retired: <why>\"", id, id)
			}
		}
	}

	var unknown []string
	for id := range cs {
		if r, ok := rs[id]; !ok || r.retired {
			unknown = append(unknown, id)
		}
	}
	slices.SortFunc(unknown, byNumber)
	for _, id := range unknown {
		what := "no rule of SPEC.md"
		if rs[id].retired {
			what = "a retired rule"
		}
		for _, s := range cs[id] {
			t.Errorf("%s cites %s, %s", s, id, what)
		}
	}
}

// byNumber orders rule ids by number, C5 before C5+.
func byNumber(a, b string) int {
	num := func(id string) (int, bool) {
		n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(id, "C"), "+"))
		return n, strings.HasSuffix(id, "+")
	}
	na, pa := num(a)
	nb, pb := num(b)
	if na != nb {
		return na - nb
	}
	if pa == pb {
		return strings.Compare(a, b)
	}
	if pa {
		return 1
	}
	return -1
}
