package reader_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/reader"
)

// TestGroup: a reader with Options.Group follows the pointers in the
// group's shape ("{group}:rebuild-group:<key>:rebuild-ptr"), also after a
// flip; one with another group finds no pointer of its group, then the
// claim in the pointer without a group, and refuses the index naming the
// group, and reads the plain shape of an index nobody claimed (C100,
// C102); one without a group finds the group's claim in the pointer
// without a group ("group:<name>") and refuses the index, through the
// cache and without, naming the group (C102). A group with a brace is
// refused (ErrBadGroup).
func TestGroup(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		ctx := redistest.Ctx(t)
		group := "g:" + tg.prefix
		tg.gen(0, "plain", 1).write(t, tg.other)
		g1, g2 := tg.gen(1, "one", 10), tg.gen(2, "two", 20)
		g1.write(t, tg.other)
		g2.write(t, tg.other)
		names := keys.Names{Cluster: tg.cluster, Group: group}
		for _, live := range []string{tg.live, tg.live + "/z", tg.family} {
			redistest.Cmd(t, tg.other, "SET", keys.PointerKey(live, names), "1")
			tg.setPtr(t, live, keys.GroupMarker(group)) // the claim, which stamps the base where that can be shared
		}

		grouped := newReader(t, tg.client(t, nil), reader.Options{Group: group})
		if got, err := grouped.Key(ctx, tg.live); err != nil || got != keys.GenKey(tg.live, 1) {
			t.Errorf("grouped Key = %q, %v; want %q", got, err, keys.GenKey(tg.live, 1))
		}
		wantData(t, ctx, grouped, tg, g1)
		other := newReader(t, tg.client(t, nil), reader.Options{Group: group + "x"})
		for range 2 { // the second through the cache, where there is one
			if got, err := other.Bucket(ctx, tg.family, "uk"); !errors.Is(err, reader.ErrGroupConflict) || !strings.Contains(err.Error(), fmt.Sprintf("not %q", group+"x")) {
				t.Errorf("reader of group %q: Bucket = %q, %v; want ErrGroupConflict naming group %q", group+"x", got, err, group)
			}
		}
		if got, err := other.Bucket(ctx, tg.family+"/free", "uk"); err != nil || got != tg.family+"/free:uk" {
			t.Errorf("reader of group %q, an index nobody claimed: Bucket = %q, %v; want the plain key", group+"x", got, err)
		}
		ungrouped := newReader(t, tg.client(t, nil), reader.Options{})
		says := fmt.Sprintf("Options.Group %q", group)
		for name, read := range map[string]func() error{
			"Bucket":  func() error { _, err := ungrouped.Bucket(ctx, tg.family, "uk"); return err },
			"Key":     func() error { _, err := ungrouped.Key(ctx, tg.live); return err },
			"Recheck": func() error { _, _, err := ungrouped.Recheck(ctx, reader.Plain(tg.live), tg.live); return err },
		} {
			if err := read(); !errors.Is(err, reader.ErrGroupConflict) || errors.Is(err, reader.ErrBadPointer) || !strings.Contains(err.Error(), says) {
				t.Errorf("reader without a group: %s: got %v, want ErrGroupConflict saying %s", name, err, says)
			}
		}

		// A flip in the group reaches the grouped reader.
		for _, live := range []string{tg.live, tg.live + "/z", tg.family} {
			redistest.Cmd(t, tg.other, "SET", keys.PointerKey(live, names), "2")
		}
		deadline := redistest.Ctx(t)
		for {
			got, err := grouped.Key(deadline, tg.live)
			if err != nil {
				t.Fatalf("Key after the flip: %v", err)
			}
			if got == keys.GenKey(tg.live, 2) {
				break
			}
		}
		wantData(t, ctx, grouped, tg, g2)

		for _, bad := range []string{"{g", "g}"} {
			if _, err := reader.New(tg.other, reader.Options{Group: bad}); !errors.Is(err, reader.ErrBadGroup) {
				t.Errorf("New with Group %q: got %v, want ErrBadGroup", bad, err)
			}
		}
	})
}
