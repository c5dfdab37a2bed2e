package keys

import (
	"fmt"
	"strings"
)

// OwnerKey returns the key of the owner stamp of live's base: the live
// key (or family prefix) whose base it is (SPEC C104).
func OwnerKey[S Space](live string, s S) string { return Base(live, s) + OwnerSuffix }

// Aliasable reports whether another live key (or family prefix) can have
// the base live has outside a group (SPEC C104). Only on a cluster, and
// for three shapes: a key without a valid hash tag, whose base ("{X}", or
// "{rbN}X" for a key with a '}') is itself a tagged key whose base it is;
// a key that is exactly "{T}", the base of the untagged T; and a key
// "{rbN}rest", the base of rest when rest has a '}' and no valid tag. A
// tagged key of any other shape, "{T}rest" with a normal tag, is its own
// base and no other key's. On a standalone server the base is the key
// itself: never.
func Aliasable(live string, cluster bool) bool {
	if !cluster {
		return false
	}
	tag, ok := HashTag(live)
	if !ok {
		return true // its base, "{X}" or "{rbN}X", is another key
	}
	// live is tagged: its own base. Only a base that starts with its tag
	// can be another key's (the tag is from the first '{', so live starts
	// with "{" + tag + "}" exactly when it starts with '{'): "{T}", the
	// base of T (no '}' in a tag, so T is untagged and wraps whole), or
	// "{rbN}rest", the base of a rest that has a '}' and no valid tag (an
	// untagged rest without '}' has the base "{rest}"; a tagged one is its
	// own). Readers ask this on every resolve: Base(rest) runs only for a
	// tag in rest's slot.
	if live[0] != '{' {
		return false
	}
	rest := live[len(tag)+2:]
	if rest == "" {
		return true
	}
	if _, ok := HashTag(rest); ok || !strings.Contains(rest, "}") || Slot(tag) != Slot(rest) {
		return false
	}
	return Base(rest, true) == live
}

// Alias returns the other live key whose base is base, that of name, an
// aliasable name (Aliasable, on a cluster): the base itself when name is
// untagged ("{X}" of X, "{rbN}a}b" of a}b), else T of "{T}" or rest of
// "{rbN}rest". An owner stamp of the base names name or Alias(name, base);
// anything else was written by hand.
func Alias(name, base string) string {
	if base != name {
		return base
	}
	tag, _ := HashTag(name)
	if rest := name[len(tag)+2:]; rest != "" {
		return rest
	}
	return tag
}

// OwnerStray returns the words of an error for the owner stamp stamp of
// live's base holding value, which names neither live nor alias, the other
// live key of that base (Alias): no run writes that.
func OwnerStray(stamp, value, live, alias string) string {
	return fmt.Sprintf("the owner stamp %s holds %q, which is neither %s nor %s, the two live keys of its base: a state no run leaves (written by hand); nothing written. If the base is %s's, SET %s %s", stamp, value, live, alias, live, stamp, live)
}

// OwnerConflict returns an error matching ErrGroupConflict for the index
// live, whose base's owner stamp, stamp, names the index owner: the two
// share every key derived from the base. It says how to part them.
func OwnerConflict(live, owner, stamp string) error {
	base := strings.TrimSuffix(stamp, OwnerSuffix)
	advice := "rename one of them"
	tagged, untagged := live, owner
	if _, ok := HashTag(tagged); !ok {
		tagged, untagged = owner, live
	}
	if _, ok := HashTag(tagged); ok && tagged != untagged {
		if _, ok := HashTag(untagged); !ok {
			advice = fmt.Sprintf("rename one of them: give %s a hash tag of its own, or move %s to %q (its own base, in the same slot)", untagged, tagged, tagged+":idx")
		}
	}
	return fmt.Errorf("%w: index %s and index %s have the same base %s, which is %s's (%s holds %q): the lock, log, pointer, registry, previous values and temp keys of one would be the other's; nothing written. To run both, %s",
		ErrGroupConflict, live, owner, base, owner, stamp, owner, advice)
}

// OwnerTampered returns the words of an error for the owner stamp stamp
// found of type kind: keyswap writes only a string there.
func OwnerTampered(stamp, kind, live string) string {
	return fmt.Sprintf("%s is a %s, a state no run leaves (written by hand): it names the live key whose base it is; nothing written. If it is %s's, SET %s %s", stamp, kind, live, stamp, live)
}
