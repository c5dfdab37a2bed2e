package main

import (
	"github.com/keyswap/keyswap/internal/scan"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
)

// globCases are patterns and keys, with what Redis answers.
var globCases = []struct {
	pattern, s string
	want       bool
}{
	{"", "", true},
	{"*", "", false}, // as in Redis; SCAN skips the match for "*" alone
	{"*", "abc", true},
	{"a*", "abc", true},
	{"a*", "ba", false},
	{"*c", "abc", true},
	{"a*c", "ac", true},
	{"a*c", "abd", false},
	{"a**c", "abbc", true},
	{"a?c", "abc", true},
	{"a?c", "ac", false},
	{"?", "", false},
	{"[abc]", "b", true},
	{"[abc]", "d", false},
	{"[^abc]", "d", true},
	{"[^abc]", "a", false},
	{"[a-c]x", "bx", true},
	{"[c-a]x", "bx", true}, // reversed range
	{"[a-c]x", "dx", false},
	{`[\]]`, "]", true},
	{`[a-]`, "-", false}, // "a-]" is the range a..']'; the class is unclosed
	{`[a-]`, "]", true},
	{"[ab", "b", true}, // unclosed class
	{"[ab", "bc", false},
	{`\*`, "*", true},
	{`\*`, "a", false},
	{`a\`, `a\`, true},
	{"users:*", "users:by-email", true},
	{"users:*", "{users:by-email}", false},
	{"*:rebuild:*", "a:rebuild:1:0123456789abcdef", true},
	{"*:rebuild:*", "a:rebuild-lock", false},
	{"a*a*a*a*a*a*a*a*b", strings.Repeat("a", 60), false},
}

func TestGlobMatch(t *testing.T) {
	for _, c := range globCases {
		if got := globMatch(c.pattern, c.s); got != c.want {
			t.Errorf("globMatch(%q, %q): got %v, want %v", c.pattern, c.s, got, c.want)
		}
	}
}

// TestGlobMatchAgreesWithRedis checks globMatch against the server's own
// matcher: for each pattern, the keys SCAN MATCH returns must be exactly the
// keys globMatch accepts.
func TestGlobMatchAgreesWithRedis(t *testing.T) {
	t.Parallel()
	c := env.Standalone.Client(t)
	ctx := t.Context()
	p := redistest.Prefix(t)
	var names []string
	for _, gc := range globCases {
		if gc.s != "" {
			names = append(names, gc.s)
		}
	}
	names = append(names, "ab", "abc", "b", "[", "]", "-", "a-", "x", "xyz")
	slices.Sort(names)
	names = slices.Compact(names)
	for _, n := range names {
		if err := c.Do(ctx, c.B().Set().Key(p+n).Value("x").Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	// Every pattern is anchored to the test's prefix, which has no glob
	// characters.
	for _, gc := range globCases {
		got := map[string]bool{}
		var cursor uint64
		for {
			e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(p+gc.pattern).Count(1000).Build()).AsScanEntry()
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range e.Elements {
				got[strings.TrimPrefix(k, p)] = true
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
		var want []string
		for _, n := range names {
			if globMatch(gc.pattern, n) {
				want = append(want, n)
			}
		}
		if g := slices.Sorted(maps.Keys(got)); !slices.Equal(g, want) {
			t.Errorf("pattern %q: SCAN MATCH got %q, globMatch got %q", gc.pattern, g, want)
		}
	}
}

func FuzzGlobMatch(f *testing.F) {
	for _, c := range globCases {
		f.Add(c.pattern, c.s)
	}
	f.Fuzz(func(t *testing.T, pattern, s string) {
		globMatch(pattern, s) // must not panic
		if s != "" && !globMatch("*", s) {
			t.Errorf("* does not match %q", s)
		}
		if !globMatch(scan.EscapeGlob(s), s) {
			t.Errorf("%q, escaped, does not match itself", s)
		}
		if !globMatch(scan.EscapeGlob(s)+"*", s+pattern) && s+pattern != "" {
			t.Errorf("%q, escaped, is not a prefix of %q", s, s+pattern)
		}
	})
}
