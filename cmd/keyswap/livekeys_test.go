package main

import (
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/keys"
)

func TestLiveNames(t *testing.T) {
	odd := keys.Base("a{}b", true) // "{rbN}a{}b"
	tag := strings.TrimSuffix(odd, "a{}b")
	for _, tc := range []struct {
		base    string
		cluster bool
		want    []liveName
	}{
		{"users:by-email", false, []liveName{{name: "users:by-email"}}},
		{"{users:by-email}", false, []liveName{{name: "{users:by-email}"}}},
		{"{users:by-email}", true, []liveName{{name: "{users:by-email}"}, {"{", "users:by-email", "}"}}},
		{"user{42}:idx", true, []liveName{{name: "user{42}:idx"}}},
		{"{a{b}", true, []liveName{{name: "{a{b}"}, {"{", "a{b", "}"}}},
		{odd, true, []liveName{{name: odd}, {pre: tag, name: "a{}b"}}},
		{"{rb1}a{}b", true, []liveName{{name: "{rb1}a{}b"}}}, // not a{}b's slot
		{"{}x", true, []liveName{{name: "{}x"}}},
	} {
		got := liveNames(tc.base, tc.cluster)
		if len(got) != len(tc.want) {
			t.Errorf("liveNames(%q, %v): got %q, want %q", tc.base, tc.cluster, got, tc.want)
			continue
		}
		for i, n := range got {
			if n != tc.want[i] || n.pre+n.name+n.post != tc.base {
				t.Errorf("liveNames(%q, %v)[%d]: got %q, want %q, which makes up the base", tc.base, tc.cluster, i, n, tc.want[i])
			}
		}
	}
}

func TestCheckGlob(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		ok      bool
	}{
		{"", true},
		{"users:*", true},
		{`a\*b`, true},
		{`a\\`, true},
		{"[abc]x", true},
		{"[^a-z]", true},
		{`[\]]`, true},
		{`[a\]`, false}, // the ']' is quoted
		{"[a-]]", true}, // "a-]" is a range, the second ']' closes
		{"[a-]", false},
		{"[ab", false},
		{"[^", false},
		{"[", false},
		{`a\`, false},
		{`[a]\`, false},
	} {
		if err := checkGlob(tc.pattern); (err == nil) != tc.ok {
			t.Errorf("checkGlob(%q): got %v, want ok=%v", tc.pattern, err, tc.ok)
		}
	}
}

// TestSweepPatternCovers checks sweepPattern's promise on live keys of
// every shape: the pattern it derives matches each temp key of a base whose
// live key status's pattern matches, as Redis's SCAN MATCH would (globMatch
// agrees with Redis: TestGlobMatchAgreesWithRedis).
func TestSweepPatternCovers(t *testing.T) {
	lives := []string{"users:by-email", "users:{42}:idx", "users:a}b", "users:a{}b", "{users}:x", "users:[x]", `users:a\b`, "users:\xff", "users:"}
	patterns := []string{"users:*", "users:?*", "users:[a-z]*", "*", "users:\\[x\\]", `users:a\\b`, "*:*", "users:\xff", "users:"}
	for _, cluster := range []bool{false, true} {
		for _, live := range lives {
			for _, pattern := range patterns {
				if checkGlob(pattern) != nil {
					t.Fatalf("test pattern %q does not pass checkGlob", pattern)
				}
				base := keys.Base(live, cluster)
				if !matchLiveKey(pattern, base, cluster) {
					continue
				}
				sweep, ok := sweepPattern(pattern, base, cluster)
				if !ok && pattern != "*" {
					t.Errorf("sweepPattern(%q, %q, %v): no pattern, though the live key matches", pattern, base, cluster)
					continue
				}
				for _, temp := range []string{keys.TempKey(live, cluster, 1700000000, 0xabc), base + ":rebuild:1700000000"} {
					if ok && !globMatch(sweep, temp) {
						t.Errorf("cluster %v: sweep pattern %q, from %q, does not match %q", cluster, sweep, pattern, temp)
					}
				}
			}
		}
	}
	// It leaves out the temp keys of live keys the pattern does not select.
	if sweep, _ := sweepPattern("users:*", "users:a", false); globMatch(sweep, "orders:users:a:rebuild:1:0123456789abcdef") {
		t.Errorf("%q matches another key's temp key", sweep)
	}
}
