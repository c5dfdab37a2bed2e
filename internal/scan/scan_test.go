package scan

import (
	"path"
	"testing"
)

func TestEscapeGlob(t *testing.T) {
	for _, s := range []string{"plain", "a*b", "a?b", "[x]", `back\slash`, "{tag}:p", "bad\xff*utf8", ""} {
		esc := EscapeGlob(s)
		// path.Match follows the same escaping rules for these characters.
		if ok, err := path.Match(esc+"*", s+"tail"); err != nil || !ok {
			t.Errorf("EscapeGlob(%q) = %q: does not match %q (err %v)", s, esc, s+"tail", err)
		}
		if s != "" {
			if ok, _ := path.Match(esc+"*", "X"+s); ok {
				t.Errorf("EscapeGlob(%q)+* matches %q", s, "X"+s)
			}
		}
	}
}
