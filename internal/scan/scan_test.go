package scan_test

import (
	"context"
	"fmt"
	"path"
	"testing"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/internal/scan"
)

func TestEscapeGlob(t *testing.T) {
	for _, s := range []string{"plain", "a*b", "a?b", "[x]", `back\slash`, "{tag}:p", "bad\xff*utf8", ""} {
		esc := scan.EscapeGlob(s)
		// path.Match follows the same escaping rules for these characters.
		if ok, err := path.Match(esc+"*", s+"tail"); err != nil || !ok {
			t.Errorf("scan.EscapeGlob(%q) = %q: does not match %q (err %v)", s, esc, s+"tail", err)
		}
		if s != "" {
			if ok, _ := path.Match(esc+"*", "X"+s); ok {
				t.Errorf("scan.EscapeGlob(%q)+* matches %q", s, "X"+s)
			}
		}
	}
}

func TestPagesInSlotScansOneMaster(t *testing.T) {
	c, err := redistest.StartCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	client := c.Client(t)
	ctx := context.Background()
	// One key per master, all matching the pattern.
	var want string
	seen := map[*redistest.Server]string{}
	for i := 0; len(seen) < 3; i++ {
		k := fmt.Sprintf("{t%d}:k", i)
		if n := c.NodeFor(t, k); seen[n] == "" {
			seen[n] = k
			if err := client.Do(ctx, client.B().Set().Key(k).Value("v").Build()).Error(); err != nil {
				t.Fatal(err)
			}
			want = k
		}
	}
	var all, one []string
	for page, err := range scan.Pages(ctx, client, scan.Options{Match: "{t*}:k"}) {
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
	}
	for page, err := range scan.Pages(ctx, client, scan.Options{Match: "{t*}:k", InSlot: true, Slot: keys.Slot(want)}) {
		if err != nil {
			t.Fatal(err)
		}
		one = append(one, page...)
	}
	if len(all) != 3 {
		t.Errorf("all masters: got %v, want the 3 keys", all)
	}
	if len(one) != 1 || one[0] != want {
		t.Errorf("InSlot %d: got %v, want only %q (its master's keys)", keys.Slot(want), one, want)
	}
}
