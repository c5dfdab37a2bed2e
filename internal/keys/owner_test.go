package keys

import (
	"strings"
	"testing"
)

// TestOwnerKeySharedBase: on a cluster "X" and "{X}", and "a}b" and its
// own base, have one owner stamp; the stamp is reserved.
func TestOwnerKeySharedBase(t *testing.T) {
	syn := "{" + SyntheticTag(Slot("a}b")) + "}a}b"
	for _, c := range []struct{ live, alias, want string }{
		{"users:by-email", "{users:by-email}", "{users:by-email}:rebuild-owner"},
		{"a}b", syn, syn + ":rebuild-owner"},
	} {
		if got := OwnerKey(c.live, true); got != c.want {
			t.Errorf("OwnerKey(%q) = %q, want %q", c.live, got, c.want)
		}
		if got := OwnerKey(c.alias, true); got != c.want {
			t.Errorf("OwnerKey(%q) = %q, want %q", c.alias, got, c.want)
		}
		if !Reserved(c.want) {
			t.Errorf("Reserved(%q) = false, want true", c.want)
		}
	}
	if got, want := OwnerKey("users", false), "users:rebuild-owner"; got != want {
		t.Errorf("OwnerKey(%q) standalone = %q, want %q", "users", got, want)
	}
}

// TestAliasable: on a cluster, the shapes whose base another live key can
// have: untagged keys, "{T}" and "{rbN}rest"; a tagged "{T}rest" is no
// other key's base, and on a standalone server no key is aliasable.
func TestAliasable(t *testing.T) {
	syn := "{" + SyntheticTag(Slot("a}b")) + "}a}b"
	for _, c := range []struct {
		live    string
		cluster bool
		want    bool
	}{
		{"users:by-email", true, true},                        // base {users:by-email}
		{"a}b", true, true},                                   // base {rbN}a}b
		{"a{}b", true, true},                                  // an empty tag is none
		{"{users:by-email}", true, true},                      // the base of users:by-email
		{syn, true, true},                                     // the base of a}b
		{"{users}:by-email", true, false},                     // a normal tag: its own base only
		{"{users}", true, true},                               // exactly {T}
		{"x{users}", true, false},                             // the tag not first
		{"{users}}", true, false},                             // rest "}" has base {rbN}}
		{"{rb0}a}b", true, Base("a}b", true) == "{rb0}a}b"},   // only the tag of a}b's slot
		{"{" + SyntheticTag(Slot("ab")) + "}ab", true, false}, // ab's base is {ab}
		{"users:by-email", false, false},
		{"{users:by-email}", false, false},
		{"a}b", false, false},
		{syn, false, false},
	} {
		if got := Aliasable(c.live, c.cluster); got != c.want {
			t.Errorf("Aliasable(%q, cluster %v) = %v, want %v", c.live, c.cluster, got, c.want)
		}
	}
}

// aliasableByDefinition is Aliasable spelled as its definition: another
// key, the tag or the rest of live (or live's base, untagged), has live's
// base.
func aliasableByDefinition(live string, cluster bool) bool {
	if !cluster {
		return false
	}
	if Base(live, true) != live {
		return true
	}
	tag, _ := HashTag(live)
	if !strings.HasPrefix(live, "{"+tag+"}") {
		return false
	}
	for _, other := range []string{tag, live[len(tag)+2:]} {
		if other != live && Base(other, true) == live {
			return true
		}
	}
	return false
}

// FuzzAliasable checks Aliasable, which skips the synthetic tag's search
// where it can, against its definition.
func FuzzAliasable(f *testing.F) {
	for _, s := range []string{"users:by-email", "a}b", "a{}b", "{users}", "{users}}", "{users}:x", "{" + SyntheticTag(Slot("a}b")) + "}a}b", "{rb0}a}b", "{}", "{", "}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, live string) {
		if got, want := Aliasable(live, true), aliasableByDefinition(live, true); got != want {
			t.Errorf("Aliasable(%q) = %v, want %v", live, got, want)
		}
	})
}
