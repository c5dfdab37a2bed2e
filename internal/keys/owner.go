package keys

import (
	"fmt"
	"strings"
)

// OwnerKey returns the key of the owner stamp of live's base: the live
// key (or family prefix) whose base it is (SPEC C104).
func OwnerKey[S Space](live string, s S) string { return Base(live, s) + OwnerSuffix }

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
