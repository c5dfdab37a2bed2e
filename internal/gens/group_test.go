package gens_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
)

// TestClaimedIndex: the pointer without a group of an index holds a
// group's claim (C102), next to the group's generation 1 (whose data keys
// keep the index's name), the plain keys of the rename-in-place shape,
// and a registry without a group holding only next. Read, Sweep, DryRun
// and DropPlain of the index without the group fail with an error
// matching keys.ErrGroupConflict naming the group, and delete nothing;
// Read's snapshot names the group.
func TestClaimedIndex(t *testing.T) {
	for _, sh := range shapes() {
		t.Run(sh.name, func(t *testing.T) {
			ctx := context.Background()
			f := newFixture(t, sh)
			f.set(f.pointerKey(), keys.GroupMarker("g"))
			f.gen(1, 3)
			if sh.family {
				plainFamily(f, 3)
			} else {
				f.set(f.idx.Live, "plain")
			}
			f.registry(keys.RegNext, "1")
			says := `in group "g"`
			snap, err := gens.Read(ctx, f.c, f.idx)
			if !errors.Is(err, keys.ErrGroupConflict) || !strings.Contains(err.Error(), says) || snap.InGroup != "g" {
				t.Errorf("Read: got %+v, %v; want InGroup g and ErrGroupConflict saying %s", snap, err, says)
			}
			if errors.Is(err, gens.ErrCorrupt) {
				t.Errorf("Read: %v matches ErrCorrupt: a claim is not corrupt", err)
			}
			_, err = gens.Sweep(ctx, f.c, f.idx, gens.Options{Grace: 1})
			if !errors.Is(err, keys.ErrGroupConflict) || !strings.Contains(err.Error(), says) {
				t.Errorf("Sweep: got %v, want ErrGroupConflict saying %s", err, says)
			}
			_, err = gens.DryRun(ctx, f.c, f.idx, gens.Options{Grace: 1})
			if !errors.Is(err, keys.ErrGroupConflict) || !strings.Contains(err.Error(), says) {
				t.Errorf("DryRun: got %v, want ErrGroupConflict saying %s", err, says)
			}
			_, err = gens.DropPlain(ctx, f.c, f.idx, gens.Options{})
			if !errors.Is(err, keys.ErrGroupConflict) || !strings.Contains(err.Error(), says) {
				t.Errorf("DropPlain: got %v, want ErrGroupConflict saying %s", err, says)
			}
			f.check(map[string]string{keys.RegNext: "1"})
		})
	}
}
