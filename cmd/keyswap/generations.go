package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// An index published with rebuild.Options.Publish = rebuild.Generations has
// a pointer, "<base>:rebuild-ptr", naming its current generation, and a
// registry, the hash "<base>:rebuild-gens", with the state of each of its
// generations: building:<token>, current, previous (kept for a rollback)
// or retired:<unix ms>. Its data keys are "<key>:rebuild-g:<G>" and
// "<prefix>:rebuild-g:<G>:<bucket>". internal/gens reads and checks the
// registry, and removes the generations no reader reads any more.

// The modes of an index, as status names them.
const (
	modeRename      = "rename"      // no pointer: the data is the plain keys
	modeGenerations = "generations" // a pointer names the current generation
	modeGroup       = "group"       // the pointer without a group holds a group's claim (SPEC C102)
)

// genStatus is an index's registry and pointer, as status shows them.
type genStatus struct {
	// Current is the generation the pointer names; 0 when there is no
	// pointer (the index is in the rename-in-place shape, and its registry
	// holds what is left of its generations).
	Current int64
	// Previous is the generation kept for a rollback; 0: none.
	Previous int64
	// Retired are the generations flipped away from, waiting for their
	// removal; Building those a run builds, or built and abandoned.
	Retired  []retiredGen
	Building []buildingGen
	// PlainLeft reports, for an index with a pointer, whether its plain
	// key still exists too: the index is switching from rename-in-place,
	// and a sweep of its plain keys has yet to run. Nil when not looked for:
	// a family, whose plain buckets only a scan finds, or an index whose
	// current generation holds no plain key (a family whose meta does not
	// say so, or an empty one).
	PlainLeft *bool
	// Corrupt is the error of a registry or pointer that holds what no
	// run writes (gens.ErrCorrupt), or of a read Redis refused; the other
	// fields are then zero.
	Corrupt string
	// InGroup is the group whose claim the pointer of an index read
	// without a group holds ("group:<name>", SPEC C102): the index is that
	// group's, and its generations are read with --group; the other
	// fields are then zero.
	InGroup string
}

// retiredGen is a retired generation.
type retiredGen struct {
	Gen int64
	// Since is its retirement.
	Since time.Time
	// Removable reports that the grace period since then has passed: a
	// sweep removes it.
	Removable bool
}

// buildingGen is a generation a run builds.
type buildingGen struct {
	Gen int64
	// TokenPrefix is the start of the token of the run that builds it.
	TokenPrefix string
	// Abandoned reports that the index's lock does not hold that token:
	// the run is gone, and a sweep removes the generation.
	Abandoned bool
}

// mode returns the index's mode.
func (g *genStatus) mode() string {
	if g != nil && g.InGroup != "" {
		return modeGroup
	}
	if g == nil || g.Current == 0 {
		return modeRename
	}
	return modeGenerations
}

// candidates returns the number of g's generations that a sweep with the
// grace g was read with would remove.
func (g *genStatus) candidates() int {
	if g == nil {
		return 0
	}
	n := 0
	for _, r := range g.Retired {
		if r.Removable {
			n++
		}
	}
	for _, b := range g.Building {
		if b.Abandoned {
			n++
		}
	}
	return n
}

// newGenStatus returns the status of the registry and pointer snap, with
// the retired generations older than grace at the server's clock
// removable, by the sweep's own rule.
func newGenStatus(snap gens.Snapshot, grace time.Duration) *genStatus {
	g := &genStatus{Retired: []retiredGen{}, Building: []buildingGen{}}
	if snap.HasPointer {
		g.Current = snap.Pointer
	}
	for _, gen := range snap.Registry.Sorted() {
		st := snap.Registry.Gens[gen]
		switch st.Kind {
		case gens.Previous:
			g.Previous = gen
		case gens.Retired:
			g.Retired = append(g.Retired, retiredGen{Gen: gen, Since: st.RetiredAt, Removable: snap.Time.Sub(st.RetiredAt) > grace})
		case gens.Building:
			g.Building = append(g.Building, buildingGen{Gen: gen, TokenPrefix: prefix(st.Token, tokenPrefixLen), Abandoned: snap.Lock != st.Token})
		}
	}
	return g
}

// readGenStatus reads the registry and pointer of the index idx (in its
// group, if any) with gens.Read, one script in the index's slot. It
// returns nil for an index
// that has neither, and a genStatus with Corrupt set for one whose
// registry or pointer is corrupt, or whose read Redis refused (an ACL
// without EVALSHA, say), so that status goes on with the other indexes.
func readGenStatus(ctx context.Context, client rueidis.Client, idx gens.Index, grace time.Duration) (*genStatus, error) {
	live := idx.Live
	snap, err := gens.Read(ctx, client, idx)
	if err != nil && snap.InGroup != "" && errors.Is(err, keys.ErrGroupConflict) {
		return &genStatus{InGroup: snap.InGroup, Retired: []retiredGen{}, Building: []buildingGen{}}, nil
	}
	if err != nil {
		if _, redisErr := rueidis.IsRedisErr(err); redisErr || errors.Is(err, gens.ErrCorrupt) {
			return &genStatus{Corrupt: err.Error(), Retired: []retiredGen{}, Building: []buildingGen{}}, nil
		}
		return nil, fmt.Errorf("reading the generations of %s: %w", displayKey(live), err)
	}
	if !snap.HasPointer && len(snap.Registry.Gens) == 0 && snap.Registry.Next == 0 {
		return nil, nil
	}
	return newGenStatus(snap, grace), nil
}

// hasGenKeys returns, for each of lives (indexes of group, none when
// empty), whether its pointer or its registry exists, with one pipelined
// EXISTS each: status of one key reads the registry (with a script) only
// for an index that has one.
func hasGenKeys(ctx context.Context, client rueidis.Client, group string, lives []string) ([]bool, error) {
	cluster := namesOf(client, group)
	ks := make([]string, 0, 2*len(lives))
	for _, l := range lives {
		ks = append(ks, keys.PointerKey(l, cluster), keys.RegistryKey(l, cluster))
	}
	found, err := existing(ctx, client, ks)
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(lives))
	for i := range lives {
		out[i] = found[ks[2*i]] || found[ks[2*i+1]]
	}
	return out, nil
}

// addGenerations reads the generations of the indexes of idx that have a
// registry or a pointer (withGens) and sets their rollback verdict by the
// rule of a rollback in Generations mode. For an index with a pointer
// whose current generation has a plain data key (keys.GenKey: it is not a
// family), it looks whether its plain key still exists: the index is then
// switching from rename-in-place.
func addGenerations(ctx context.Context, client rueidis.Client, idx []indexStatus, withGens []bool, grace time.Duration) error {
	var plain []int
	var ks []string
	for i := range idx {
		if !withGens[i] {
			continue
		}
		g, err := readGenStatus(ctx, client, gens.Index{Live: idx[i].Key, Group: idx[i].Group}, grace)
		if err != nil {
			return err
		}
		idx[i].Gens = g
		if g.mode() != modeGenerations {
			continue
		}
		idx[i].Rollback = genRollbackOf(g, idx[i].LockKey)
		if idx[i].Generation == nil || idx[i].Generation.FamilyType == "" {
			plain = append(plain, i)
			ks = append(ks, keys.GenKey(idx[i].Key, g.Current), idx[i].Key)
		}
	}
	found, err := existing(ctx, client, ks)
	if err != nil {
		return err
	}
	for _, i := range plain {
		if found[keys.GenKey(idx[i].Key, idx[i].Gens.Current)] {
			left := found[idx[i].Key]
			idx[i].Gens.PlainLeft = &left
		}
	}
	return nil
}

// genRollbackOf returns whether 'keyswap rollback' of an index in
// Generations mode, g, would flip it back now, lock being the lock a
// rebuild holds on it ("" for none): it needs a previous generation, and
// no run holding the lock. A previous generation is kept until the next
// flip, without a time limit.
func genRollbackOf(g *genStatus, lock string) rollbackState {
	switch {
	case g.Previous == 0:
		return rollbackState{WhyNot: rollbackNoneKept}
	case lock != "":
		return rollbackState{WhyNot: rollbackLocked}
	}
	return rollbackState{Possible: true}
}

// genStatusJSON is a genStatus in JSON.
type genStatusJSON struct {
	Current   *int64        `json:"current"`
	Previous  *int64        `json:"previous"`
	Retired   []retiredJSON `json:"retired"`
	Building  []buildJSON   `json:"building"`
	PlainLeft *bool         `json:"plain_keys_left"`
	Error     string        `json:"error,omitempty"`
	InGroup   string        `json:"in_group,omitempty"`
}

// retiredJSON is a retiredGen in JSON.
type retiredJSON struct {
	Gen       int64     `json:"gen"`
	Since     time.Time `json:"since"`
	Removable bool      `json:"removable"`
}

// buildJSON is a buildingGen in JSON.
type buildJSON struct {
	Gen         int64  `json:"gen"`
	TokenPrefix string `json:"token_prefix"`
	Abandoned   bool   `json:"abandoned"`
}

// json returns g in JSON: null when nil.
func (g *genStatus) json() *genStatusJSON {
	if g == nil {
		return nil
	}
	nonZero := func(n int64) *int64 {
		if n == 0 {
			return nil
		}
		return &n
	}
	out := &genStatusJSON{Current: nonZero(g.Current), Previous: nonZero(g.Previous), PlainLeft: g.PlainLeft, Error: g.Corrupt, InGroup: g.InGroup,
		Retired: make([]retiredJSON, 0, len(g.Retired)), Building: make([]buildJSON, 0, len(g.Building))}
	for _, r := range g.Retired {
		out.Retired = append(out.Retired, retiredJSON{Gen: r.Gen, Since: r.Since.UTC(), Removable: r.Removable})
	}
	for _, b := range g.Building {
		out.Building = append(out.Building, buildJSON(b))
	}
	return out
}

// columns returns g's columns in the table of generations: the mode, the
// current and previous generations, the retired ones and the builds,
// then a note.
func (g *genStatus) columns(now time.Time) []string {
	if g.Corrupt != "" {
		return []string{"?", "?", "?", "?", "?", "unreadable: " + g.Corrupt}
	}
	if g.InGroup != "" {
		return []string{modeGroup, "-", "-", "-", "-", "in group " + displayKey(g.InGroup) + ": pass --group " + displayKey(g.InGroup)}
	}
	cur, prev := "-", "-"
	if g.Current != 0 {
		cur = fmtInt(g.Current)
	}
	if g.Previous != 0 {
		prev = fmtInt(g.Previous)
	}
	var retired, building []string
	for _, r := range g.Retired {
		s := fmt.Sprintf("%d (%s ago", r.Gen, fmtSince(r.Since, now))
		if r.Removable {
			s += ", removable"
		}
		retired = append(retired, s+")")
	}
	for _, b := range g.Building {
		s := fmt.Sprintf("%d (run %s)", b.Gen, displayKey(b.TokenPrefix))
		if b.Abandoned {
			s = fmt.Sprintf("%d (abandoned by %s)", b.Gen, displayKey(b.TokenPrefix))
		}
		building = append(building, s)
	}
	note := "-"
	switch {
	case g.Current == 0:
		note = "no pointer: in the rename-in-place shape"
	case g.PlainLeft != nil && *g.PlainLeft:
		note = "switching: the plain key is left from rename-in-place"
	}
	return []string{g.mode(), cur, prev, joinOr(retired, "-"), joinOr(building, "-"), note}
}

// joinOr joins ss with ", ", or returns none for no element.
func joinOr(ss []string, none string) string {
	if len(ss) == 0 {
		return none
	}
	return strings.Join(ss, ", ")
}

// namesOf returns how the control keys of indexes in group (none when
// empty) are named on client's deployment.
func namesOf(client rueidis.Client, group string) keys.Names {
	return keys.Names{Cluster: client.Mode() == rueidis.ClientModeCluster, Group: group}
}
