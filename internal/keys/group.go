package keys

import (
	"errors"
	"fmt"
	"strings"
)

// Names is how the control keys of an index are named: whether keys take
// Redis Cluster shapes, and the group of the indexes, if any.
//
// In a group every control key of an index (its lock and what hangs off
// it, its meta, pointer and registry) hangs off GroupBase(Group, live),
// on a standalone server as on a cluster: the keys of every index of the
// group share the group's hash slot, whatever their names, so that one
// script can check and flip them together, while the index's data keys in
// a generation keep their own names and spread over the slots.
type Names struct {
	Cluster bool
	Group   string
}

// Space is what the functions that name control keys take: a bool, true
// on a cluster, for an index whose control keys hang off its own name, or
// a Names, which may also name a group.
//
// Both are accepted so that the many callers that name the keys of an
// index of its own keep passing a bool, and a caller that may be in a
// group passes its Names the same way.
type Space interface{ bool | Names }

// namesOf returns s as a Names.
func namesOf[S Space](s S) Names {
	switch v := any(s).(type) {
	case Names:
		return v
	case bool:
		return Names{Cluster: v}
	}
	panic("keyswap: keys: a Space neither bool nor Names") // unreachable: Space has two types
}

// ErrBadGroup is what CheckGroup returns for a group that cannot name a
// hash tag.
var ErrBadGroup = errors.New("bad group")

// CheckGroup returns an error matching ErrBadGroup when group cannot be a
// group of indexes: empty, or holding '{' or '}' (the hash tag of the
// control keys would not be the group).
func CheckGroup(group string) error {
	if group == "" {
		return fmt.Errorf("%w: empty", ErrBadGroup)
	}
	if strings.ContainsAny(group, "{}") {
		return fmt.Errorf("%w: %q holds a brace: the group must be the whole hash tag, {group}, of its indexes' control keys", ErrBadGroup, group)
	}
	return nil
}

// GroupInfix follows the group's hash tag in the base of the control keys
// of an index in a group: "{" + group + "}" + GroupInfix + live. No base of
// an index of its own has it after its first '}' (keys.Reserved refuses a
// key of that shape), so the control keys of an index in a group never
// meet those of an index of its own, and a scan finds the group and the
// index in the name of each (ParseGroupBase).
const GroupInfix = ":rebuild-group:"

// GroupBase returns the base of the control keys of live in group:
// "{" + group + "}" + GroupInfix + live. Its hash tag is group, live
// having no say: the first '{' is ours, and group holds no '}'.
func GroupBase(group, live string) string { return "{" + group + "}" + GroupInfix + live }

// ParseGroupBase returns the group and the index of base when base has
// the shape of GroupBase: a '{' first, a non-empty group without '{',
// then "}" + GroupInfix.
func ParseGroupBase(base string) (group, live string, ok bool) {
	if !strings.HasPrefix(base, "{") {
		return "", "", false
	}
	end := strings.IndexByte(base, '}')
	if end < 2 || strings.IndexByte(base[1:end], '{') >= 0 || !strings.HasPrefix(base[end+1:], GroupInfix) {
		return "", "", false
	}
	return base[1:end], base[end+1+len(GroupInfix):], true
}

// SameSlot reports whether the keys of the index live (a live key or a
// family's prefix) in a generation share the hash slot of its control
// keys named by s: on a standalone server, or on a cluster when live has a
// hash tag and the index is in no group (a group's control keys hang off
// the group's tag, its data keys off their own names). Only such a family
// has a manifest per generation (ManifestKey).
func SameSlot[S Space](live string, s S) bool {
	n := namesOf(s)
	if !n.Cluster {
		return true
	}
	_, tagged := HashTag(live)
	return tagged && n.Group == ""
}

// GroupMarkerPrefix starts the value of the pointer of an index of its own
// (PointerKey with no group) that a run in a group claimed (SPEC C102):
// GroupMarkerPrefix + group. No generation starts with it, so a reader of
// that pointer tells the claim from a generation, and refuses to read the
// index without the group.
const GroupMarkerPrefix = "group:"

// GroupMarker returns the value a run in group leaves in the pointer of
// an index of its own when it claims the index (SPEC C102).
func GroupMarker(group string) string { return GroupMarkerPrefix + group }

// ParseGroupMarker returns the group a pointer's value v names, when v is
// a GroupMarker.
func ParseGroupMarker(v string) (group string, ok bool) {
	if group, ok = strings.CutPrefix(v, GroupMarkerPrefix); !ok {
		return "", false
	}
	return group, true
}

// ErrGroupConflict reports that an index belongs to a group other than
// the one it is written or read with, or that a run in a group met
// generations of the index written without it (SPEC C102). The generation
// data keys of an index keep its name whatever its group, so the two
// would write into the same keys: nothing is written or read. It also
// reports an index whose base (its lock, pointer, registry) belongs to
// another index (SPEC C104): on a cluster "X" and "{X}" share one.
var ErrGroupConflict = errors.New("the index belongs to another group, or to none, or its base to another index")

// GroupConflict returns an error matching ErrGroupConflict for the index
// live, whose pointer without a group, ptr, names group, met by a caller
// whose own group is mine ("" for none): it names the group to pass.
func GroupConflict(live, ptr, group, mine string) error {
	if mine == "" {
		return fmt.Errorf("%w: index %s is in group %q (%s holds %q): pass the group %q (rebuild.Options.Group, reader.Options.Group, --group)", ErrGroupConflict, live, group, ptr, GroupMarker(group), group)
	}
	return fmt.Errorf("%w: index %s is in group %q (%s holds %q), not %q: pass the group %q", ErrGroupConflict, live, group, ptr, GroupMarker(group), mine, group)
}
