package keys

import (
	"errors"
	"strings"
	"testing"
)

func TestGroupShapes(t *testing.T) {
	// C100: in a group every control key hangs off "{group}:rebuild-group:"
	// + the index's key, in the group's slot on a cluster as on a
	// standalone server, whatever the key's own tag.
	in := Names{Cluster: true, Group: "g1"}
	for _, live := range []string{"tags", "user{42}:idx", "a{}b", "a}b", "{g1}:rebuild-group"} {
		base := "{g1}" + GroupInfix + live
		for name, got := range map[string]string{
			"Base": Base(live, in), "LockKey": LockKey(live, in), "MetaKey": MetaKey(live, in),
			"PointerKey": PointerKey(live, in), "RegistryKey": RegistryKey(live, in),
		} {
			if Slot(got) != Slot("g1") {
				t.Errorf("%s(%q) = %q: slot %d, want the group's %d", name, live, got, Slot(got), Slot("g1"))
			}
			if got[:len(base)] != base {
				t.Errorf("%s(%q) = %q, want it to start with %q", name, live, got, base)
			}
		}
		if got := PointerKey(live, Names{Group: "g1"}); got != base+PointerSuffix {
			t.Errorf("standalone PointerKey(%q) = %q, want %q", live, got, base+PointerSuffix)
		}
		g, l, ok := ParseGroupBase(Base(live, in))
		if !ok || g != "g1" || l != live {
			t.Errorf("ParseGroupBase(%q) = %q, %q, %v; want g1, %q, true", Base(live, in), g, l, ok, live)
		}
		if !Reserved(base) {
			t.Errorf("Reserved(%q) = false: an index of its own would share a grouped index's control keys", base)
		}
	}
	// Without a group, Names is the bool.
	if PointerKey("tags", Names{Cluster: true}) != PointerKey("tags", true) || LockKey("a}b", Names{}) != LockKey("a}b", false) {
		t.Error("Names without a group names keys unlike its bool")
	}
	for _, base := range []string{"tags", "{g}tags", "{}" + GroupInfix + "x", "{a{b}" + GroupInfix + "x", "x{g}" + GroupInfix} {
		if _, _, ok := ParseGroupBase(base); ok {
			t.Errorf("ParseGroupBase(%q) ok", base)
		}
	}
}

func TestCheckGroup(t *testing.T) {
	// C100: a group is non-empty, without braces.
	for _, tc := range []struct {
		group string
		ok    bool
	}{{"g", true}, {"users:v2", true}, {"", false}, {"{g", false}, {"g}", false}, {"{g}", false}} {
		err := CheckGroup(tc.group)
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrBadGroup) {
			t.Errorf("CheckGroup(%q) = %v, want ok %v (else ErrBadGroup)", tc.group, err, tc.ok)
		}
	}
}

func TestSameSlot(t *testing.T) {
	// C99, C100: a generation's keys share its control keys' slot on a
	// standalone server, or on a cluster for a key with a hash tag in no
	// group; a grouped index's control keys hang off the group's tag, so
	// on a cluster it has no manifest, even with a tag of its own.
	for _, tc := range []struct {
		live string
		s    Names
		want bool
	}{
		{"tags", Names{}, true},
		{"tags", Names{Group: "g"}, true},
		{"{t}tags", Names{Cluster: true}, true},
		{"tags", Names{Cluster: true}, false},
		{"{t}tags", Names{Cluster: true, Group: "g"}, false},
		{"{g}tags", Names{Cluster: true, Group: "g"}, false},
		{"tags", Names{Cluster: true, Group: "g"}, false},
	} {
		if got := SameSlot(tc.live, tc.s); got != tc.want {
			t.Errorf("SameSlot(%q, %+v) = %v, want %v", tc.live, tc.s, got, tc.want)
		}
		if tc.s.Group == "" && SameSlot(tc.live, tc.s.Cluster) != tc.want {
			t.Errorf("SameSlot(%q, %v) differs from its Names", tc.live, tc.s.Cluster)
		}
	}
}

func FuzzGroupBase(f *testing.F) {
	f.Add("g", "users:by-email")
	f.Add("x", "{t}a")
	f.Fuzz(func(t *testing.T, group, live string) {
		if CheckGroup(group) != nil {
			return
		}
		base := GroupBase(group, live)
		if Slot(base+PointerSuffix) != Slot(group) {
			t.Fatalf("GroupBase(%q, %q) = %q: not in the group's slot", group, live, base)
		}
		g, l, ok := ParseGroupBase(base)
		if !ok || g != group || l != live {
			t.Fatalf("ParseGroupBase(%q) = %q, %q, %v", base, g, l, ok)
		}
	})
}

func TestGroupMarker(t *testing.T) {
	// C102: the claim's marker names its group, and no generation (a
	// positive decimal number) parses as one.
	for _, tc := range []struct {
		v     string
		group string
		ok    bool
	}{
		{GroupMarker("users"), "users", true},
		{GroupMarker("a:b"), "a:b", true},
		{"group:", "", true},
		{"1", "", false},
		{"groups:x", "", false},
		{"", "", false},
	} {
		if g, ok := ParseGroupMarker(tc.v); g != tc.group || ok != tc.ok {
			t.Errorf("ParseGroupMarker(%q) = %q, %v; want %q, %v", tc.v, g, ok, tc.group, tc.ok)
		}
	}
	if err := GroupConflict("L", "L:rebuild-ptr", "g", ""); !errors.Is(err, ErrGroupConflict) || !strings.Contains(err.Error(), `pass the group "g"`) {
		t.Errorf("GroupConflict = %v, want ErrGroupConflict naming the group to pass", err)
	}
}
