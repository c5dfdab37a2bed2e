package rebuild

import (
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// SlotTxn is a transaction for SplitBySlot: Members parallel to Cmds, or
// nil (a batch's own writes); Probes are keys probed with EXISTS.
type SlotTxn struct {
	Label   string
	Cmds    rueidis.Commands
	Members [][]string
	Probes  []string
}

// SlotPart is one transaction SplitBySlot returns: the keys its commands
// write, their members (nil where none), and the keys it probes.
type SlotPart struct {
	Slot    uint16
	Label   string
	Keys    []string
	Members [][]string
	Probes  []string
}

// SplitBySlot runs the split of a round trip's transactions on a cluster
// in Generations mode.
func SplitBySlot(txns []SlotTxn) []SlotPart {
	probes := map[string]*target{}
	var in []*txn
	for _, st := range txns {
		t := &txn{label: st.Label, cmds: st.Cmds}
		for i, m := range st.Members {
			tg := &target{}
			tg.Key = st.Cmds[i].Commands()[1]
			tg.slot = keys.Slot(tg.Key)
			t.writes = append(t.writes, tg)
			t.members = append(t.members, m)
		}
		for _, k := range st.Probes {
			if probes[k] == nil {
				probes[k] = &target{}
				probes[k].Key = k
				probes[k].slot = keys.Slot(k)
			}
			t.probes = append(t.probes, probes[k])
		}
		in = append(in, t)
	}
	parts, slots := splitBySlot(in)
	var out []SlotPart
	for _, s := range slots {
		p := parts[s]
		sp := SlotPart{Slot: s, Label: p.label, Members: p.members}
		for i, c := range p.cmds {
			sp.Keys = append(sp.Keys, c.Commands()[1])
			if i < len(p.writes) && p.writes[i] != nil && p.writes[i].Key != c.Commands()[1] {
				panic("writes not parallel to cmds")
			}
		}
		for _, tg := range p.probes {
			sp.Probes = append(sp.Probes, tg.Key)
		}
		out = append(out, sp)
	}
	return out
}

// SortBySlot returns the keys of merged commands in the order the sender
// packs them on a cluster in Generations mode.
func SortBySlot(ks []string) []string {
	cmds := make([]mergedCmd, len(ks))
	for i, k := range ks {
		t := &target{}
		t.Key = k
		t.slot = keys.Slot(k)
		cmds[i] = mergedCmd{t: t, name: "SADD"}
	}
	var out []string
	for _, c := range sortBySlot(cmds) {
		out = append(out, c.t.Key)
	}
	return out
}
