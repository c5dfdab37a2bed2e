package main

// globMatch reports whether s matches the Redis glob pattern, with the
// semantics of SCAN MATCH and KEYS: '*' matches any run of bytes, '?' any
// one byte, "[abc]", "[a-z]" and "[^abc]" a class of bytes, and '\' quotes
// the next byte. It is a port of Redis's stringmatchlen (util.c), unclosed
// brackets and reversed ranges included, so that a pattern means the same
// here as it does on the server.
func globMatch(pattern, s string) bool {
	skipLonger := false
	return globMatchImpl(pattern, s, &skipLonger)
}

// globMatchImpl is stringmatchlen_impl. skipLonger is Redis's
// skipLongerMatches: once the text after a '*' failed to match every suffix
// of s, no longer suffix can match either, which keeps patterns such as
// "a*a*a*a*b" from taking exponential time.
func globMatchImpl(p, s string, skipLonger *bool) bool {
	for len(p) > 0 && len(s) > 0 {
		switch p[0] {
		case '*':
			return globStar(p, s, skipLonger)
		case '?':
			s = s[1:]
		case '[':
			var match bool
			if p, match = globClass(p[1:], s[0]); !match {
				return false
			}
			s = s[1:]
			if len(p) == 0 {
				// The unclosed class consumed the pattern (see globClass).
				return len(s) == 0
			}
		case '\\':
			if len(p) >= 2 {
				p = p[1:]
			}
			fallthrough
		default:
			if p[0] != s[0] {
				return false
			}
			s = s[1:]
		}
		p = p[1:]
		if len(s) == 0 {
			for len(p) > 0 && p[0] == '*' {
				p = p[1:]
			}
			break
		}
	}
	return len(p) == 0 && len(s) == 0
}

// globStar matches s against p, which starts with a '*': against the rest
// of p at every suffix of s, longest first.
func globStar(p, s string, skipLonger *bool) bool {
	for len(p) > 1 && p[1] == '*' {
		p = p[1:]
	}
	if len(p) == 1 {
		return true
	}
	for len(s) > 0 {
		if globMatchImpl(p[1:], s, skipLonger) {
			return true
		}
		if *skipLonger {
			return false
		}
		s = s[1:]
	}
	*skipLonger = true
	return false
}

// globClass matches c against the class that p starts with, just after its
// '[', and returns p from the class's ']' on, or empty for a class that is
// not closed.
func globClass(p string, c byte) (rest string, match bool) {
	not := len(p) > 0 && p[0] == '^'
	if not {
		p = p[1:]
	}
	for {
		if len(p) >= 2 && p[0] == '\\' {
			p = p[1:]
			if p[0] == c {
				match = true
			}
		} else if len(p) == 0 {
			// An unclosed class ends with the pattern. Redis steps
			// back one byte here so that its p++ below lands on the
			// end; leaving p empty and skipping that step is the same.
			break
		} else if p[0] == ']' {
			break
		} else if len(p) >= 3 && p[1] == '-' {
			lo, hi := p[0], p[2]
			if lo > hi {
				lo, hi = hi, lo
			}
			p = p[2:]
			if c >= lo && c <= hi {
				match = true
			}
		} else if p[0] == c {
			match = true
		}
		p = p[1:]
	}
	return p, match != not
}
