package main

import (
	"errors"
	"slices"
	"strings"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/scan"
)

// liveName is a live key that the base of a lock or temp key may stand
// for, and what keyswap put around it to make the base: base = pre + name +
// post.
type liveName struct{ pre, name, post string }

// liveNames returns the names a base may stand for: the base itself and, on
// a cluster, the live key without the hash tag keyswap adds to pin derived
// keys to its slot (see keys.Base): "{users:by-email}" stands for
// users:by-email (or for a live key spelled "{users:by-email}"), and
// "{rb42}a{}b" for a{}b when slot(rb42) = slot(a{}b).
func liveNames(base string, cluster bool) []liveName {
	out := []liveName{{name: base}}
	if !cluster || !strings.HasPrefix(base, "{") {
		return out
	}
	end := strings.IndexByte(base, '}')
	if end < 2 {
		return out
	}
	tag, rest := base[1:end], base[end+1:]
	switch {
	case rest == "":
		out = append(out, liveName{pre: "{", name: tag, post: "}"})
	case isSyntheticTag(tag) && keys.Slot(rest) == keys.Slot(tag):
		out = append(out, liveName{pre: base[:end+1], name: rest})
	}
	return out
}

// isSyntheticTag reports whether tag has the shape of keys.SyntheticTag's
// tags: "rb" and decimal digits.
func isSyntheticTag(tag string) bool {
	digits, ok := strings.CutPrefix(tag, "rb")
	return ok && digits != "" && strings.Trim(digits, "0123456789") == ""
}

// matchLiveKey reports whether pattern matches a live key that base, the
// base of a lock or temp key, stands for. "" and "*" match everything, even
// an empty key, as "*" does for SCAN, which skips the match for it.
func matchLiveKey(pattern, base string, cluster bool) bool {
	if pattern == "" || pattern == "*" {
		return true
	}
	return slices.ContainsFunc(liveNames(base, cluster), func(n liveName) bool { return globMatch(pattern, n.name) })
}

// sweepPattern returns the sweep --pattern that matches the temp keys of
// base whose live key matches pattern, status's pattern: pattern with what
// keyswap put around the live key, then ":rebuild:*". "users:*" becomes
// "users:*:rebuild:*" and, for a base "{users:by-email}" on a cluster,
// "{users:*}:rebuild:*". It matches every temp key of such a base, and the
// temp keys of no other base unless base has ":rebuild:" in it. ok is false
// when pattern matches no live key of base. pattern must pass checkGlob.
func sweepPattern(pattern, base string, cluster bool) (sweep string, ok bool) {
	for _, n := range liveNames(base, cluster) {
		if globMatch(pattern, n.name) {
			return scan.EscapeGlob(n.pre) + pattern + scan.EscapeGlob(n.post) + keys.TempInfix + "*", true
		}
	}
	return "", false
}

// checkGlob returns an error when pattern opens a '[' class that it never
// closes or ends in an unescaped '\'. Redis reads both (an unclosed class
// ends with the pattern; a final '\' is a literal '\'), but such a pattern
// changes meaning when text is appended to it, as sweepPattern does. The
// walk follows globMatch's.
func checkGlob(pattern string) error {
	for i := 0; i < len(pattern); i++ {
		switch pattern[i] {
		case '\\':
			if i == len(pattern)-1 {
				return errors.New(`it ends in a '\' that escapes nothing (write \\ for a literal '\')`)
			}
			i++
		case '[':
			n := classLen(pattern[i+1:])
			if n < 0 {
				return errors.New(`a '[' is not closed by a ']' (write \[ for a literal '[')`)
			}
			i += n
		}
	}
	return nil
}

// classLen returns the length of p's first bytes, which follow a '[', up to
// and including the ']' that closes the class, or -1 when none does. As in
// globMatch, '\' quotes the next byte, and the ']' of "a-]" ends a range
// rather than the class.
func classLen(p string) int {
	i := 0
	if i < len(p) && p[i] == '^' {
		i++
	}
	for i < len(p) {
		switch {
		case p[i] == '\\' && i+1 < len(p):
			i += 2
		case p[i] == ']':
			return i + 1
		case i+2 < len(p) && p[i+1] == '-':
			i += 3
		default:
			i++
		}
	}
	return -1
}
