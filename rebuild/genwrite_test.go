package rebuild_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
)

// On a cluster in Generations mode, a round trip's transactions become one
// transaction per slot, carrying that slot's commands of every transaction
// in their order, so that a family spread over every slot does not pay a
// MULTI/EXEC and a counter INCR per bucket. TestGenerationsRunFlips and
// TestGenerationsFailures run them on a cluster.
func TestSplitBySlotOneTransactionPerSlot(t *testing.T) {
	cb := env.Cluster.Client(t).B()

	batch := rebuild.SlotTxn{Label: "batch 1 (2 items)", Cmds: rueidis.Commands{
		cb.Hset().Key("{a}h").FieldValue().FieldValue("f", "1").Build(),
		cb.Hset().Key("{b}h").FieldValue().FieldValue("f", "2").Build(),
	}}
	merged1 := rebuild.SlotTxn{Label: "merged writes", Cmds: rueidis.Commands{
		cb.Sadd().Key("{a}s").Member("m1", "m2").Build(),
		cb.Sadd().Key("{b}s").Member("m3").Build(),
	}, Members: [][]string{{"m1", "m2"}, {"m3"}}, Probes: []string{"{a}s"}}
	merged2 := rebuild.SlotTxn{Label: "merged writes", Cmds: rueidis.Commands{
		cb.Sadd().Key("{a}t").Member("m4").Build(),
	}, Members: [][]string{{"m4"}}, Probes: []string{"{a}s"}}
	got := rebuild.SplitBySlot([]rebuild.SlotTxn{batch, merged1, merged2})
	a, b := keys.Slot("{a}"), keys.Slot("{b}")
	want := []rebuild.SlotPart{
		{Slot: a, Label: fmt.Sprintf("batch 1 (2 items) and 2 more, slot %d", a), Keys: []string{"{a}h", "{a}s", "{a}t"},
			Members: [][]string{nil, {"m1", "m2"}, {"m4"}}, Probes: []string{"{a}s"}},
		{Slot: b, Label: fmt.Sprintf("batch 1 (2 items) and 1 more, slot %d", b), Keys: []string{"{b}h", "{b}s"},
			Members: [][]string{nil, {"m3"}}},
	}

	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("per-slot transactions (-want +got):\n%s", diff)
	}
}

// The merged writes a cluster run in Generations mode sends are sorted by
// slot, so that each transaction carries few slots, keeping the order of
// each slot's commands, and with consecutive slots spread over the
// masters.
func TestSortBySlotGroupsSlots(t *testing.T) {
	// Few commands are sorted, many counted into place.
	for _, n := range []int{300, 3000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { sortBySlot(t, n) })
	}
}

func sortBySlot(t *testing.T, n int) {
	var in []string
	for i := range n {
		in = append(in, fmt.Sprintf("fam:b%d", i))
		if i%50 == 0 {
			in = append(in, fmt.Sprintf("{fam}b%d", i))
		}
	}
	got := rebuild.SortBySlot(slices.Clone(in))
	if len(got) != len(in) {
		t.Fatalf("%d keys sorted, want %d", len(got), len(in))
	}
	seen := map[uint16]bool{}
	for i, k := range got {
		s := keys.Slot(k)
		if i > 0 && keys.Slot(got[i-1]) != s && seen[s] {
			t.Fatalf("slot %d of %q apart from its other keys: %v", s, k, got)
		}
		seen[s] = true
	}
	// Within a slot, the order of in.
	tagged := slices.DeleteFunc(slices.Clone(got), func(k string) bool { return keys.Slot(k) != keys.Slot("{fam}") })
	wantTagged := slices.DeleteFunc(slices.Clone(in), func(k string) bool { return keys.Slot(k) != keys.Slot("{fam}") })
	if !slices.Equal(tagged, wantTagged) {
		t.Errorf("keys of one slot reordered: %v, want %v", tagged, wantTagged)
	}
	masters := map[string]bool{}
	for _, k := range got[:10] {
		masters[env.Cluster.NodeFor(t, k).Addr] = true
	}
	if len(masters) < 2 {
		t.Errorf("the first 10 keys sorted are all on one master: %v", got[:10])
	}
}
