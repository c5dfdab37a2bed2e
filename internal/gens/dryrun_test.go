package gens_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
)

// TestDryRun plans the sweep of an index with a generation in every state:
// the plan names the generations Sweep then removes, with the keys of a
// plain index counted (a family's are not: -1), and the dry run deletes
// nothing.
func TestDryRun(t *testing.T) {
	forShapes(t, func(t *testing.T, f *fixture) {
		ctx := redistest.Ctx(t)
		now := time.Now()
		fields, _ := f.everyGeneration(now)
		plan, err := gens.DryRun(ctx, f.c, f.idx, gens.Options{Now: now})
		if err != nil {
			t.Fatal(err)
		}
		fmtInt := func(n int64) string { return strconv.FormatInt(n, 10) }
		counted := func(n int64) int64 {
			if f.idx.Family {
				return -1
			}
			return n
		}
		var remove []string
		for _, r := range plan.Remove {
			remove = append(remove, fmtInt(r.Gen)+" "+r.State.Raw+" "+fmtInt(r.Keys))
		}
		want := []string{
			"1 " + fields["1"] + " " + fmtInt(counted(1)),
			"6 " + fields["6"] + " " + fmtInt(counted(1)),
			"7 " + fields["7"] + " " + fmtInt(counted(0)),
		}
		if diff := cmp.Diff(want, remove); diff != "" {
			t.Errorf("plan.Remove (-want +got):\n%s", diff)
		}
		kept := map[int64]gens.Reason{}
		for _, k := range plan.Keep {
			kept[k.Gen] = k.Reason
		}
		if diff := cmp.Diff(map[int64]gens.Reason{2: gens.SkipGrace, 3: gens.SkipPrevious, 4: gens.SkipCurrent, 5: gens.SkipRunning}, kept); diff != "" {
			t.Errorf("plan.Keep (-want +got):\n%s", diff)
		}
		if !plan.Now.Equal(now) {
			t.Errorf("plan.Now = %v, want %v", plan.Now, now)
		}
		f.check(fields) // nothing deleted

		// The sweep does what was planned.
		res, err := gens.Sweep(ctx, f.c, f.idx, gens.Options{Now: now})
		if err != nil {
			t.Fatal(err)
		}
		wantResult(t, res, []int64{1, 6, 7}, kept)
	})
}

// TestDryRunRefusesCorruptRegistry gives the dry run a pointer that names
// no current generation: it fails as Sweep does, naming the pointer.
func TestDryRunRefusesCorruptRegistry(t *testing.T) {
	t.Parallel()
	f := newFixture(t, shape{name: "standalone/family", family: true})
	f.registry(keys.RegNext, "2", "1", retired(time.Unix(1, 0)), "2", keys.RegCurrent)
	f.set(f.pointerKey(), "1")
	f.gen(1, 3)
	_, err := gens.DryRun(redistest.Ctx(t), f.c, f.idx, gens.Options{})
	var ce *gens.CorruptError
	if !errors.As(err, &ce) || ce.Key != f.pointerKey() || ce.Value != "1" {
		t.Fatalf("DryRun: %v, want a *CorruptError naming %s = \"1\"", err, f.pointerKey())
	}
	f.check(map[string]string{keys.RegNext: "2", "1": retired(time.Unix(1, 0)), "2": keys.RegCurrent})
}
