package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// An index that keyswap published (a live key, or a family of keys under a
// prefix) has a meta, "<base>:rebuild-gen": a hash with the generation
// live and, when the publish kept the values it replaced
// (Options.KeepPrevious), the generation kept for 'keyswap rollback' and
// until when. Status lists the indexes from their metas.

// indexStatus is one index, from its meta.
type indexStatus struct {
	// Key is the live key, or a family's prefix: what 'keyswap rollback'
	// takes. MetaKey is its meta.
	Key, MetaKey string
	// Group is the index's group (rebuild.Options.Group), found in the
	// name of its meta, registry or pointer (keys.ParseGroupBase); empty
	// for an index of its own.
	Group string
	// Generation is nil when the index was never published (it has no
	// meta): only 'status <key>' shows such an index.
	Generation *generation
	// LockKey is the index's lock when a rebuild (or a rollback) holds
	// it; "" otherwise.
	LockKey  string
	Rollback rollbackState
	// Gens is the index's registry and pointer of Generations mode; nil
	// for an index that has neither (it was never published in that
	// mode).
	Gens *genStatus
	// Ambiguous is not nil for an index found by a scan whose base two
	// live keys share (SPEC C104) and whose owner stamp names neither:
	// Key is then a guess.
	Ambiguous *ambiguousBase
	// BaseOwner is, for an index read by key, the other live key whose
	// base the index's is, as the base's owner stamp says (SPEC C104): the
	// index rebuilt in place, and the meta, pointer, registry and lock of
	// the base are BaseOwner's, not read as the index's. Empty otherwise.
	BaseOwner string
}

// rollbackState says whether 'keyswap rollback' of an index would roll
// back now, as the rollback script decides it, and if not, why.
type rollbackState struct {
	Possible bool
	// Until is when the kept generation expires, while Possible.
	Until time.Time
	// WhyNot is one of the rollback* reasons when not Possible.
	WhyNot string
}

// The reasons a rollback is not possible, as -json gives them.
const (
	rollbackNeverPublished = "never_published"     // no meta
	rollbackNoneKept       = "none_kept"           // published without KeepPrevious, or rolled back to a first generation
	rollbackExpired        = "expired"             // the kept generation's time ran out
	rollbackLocked         = "rebuild_in_progress" // a rebuild holds the index's lock: rollback refuses
	rollbackBaseOwned      = "base_owned"          // the base's owner stamp names another index (SPEC C104): rollback refuses
)

// rollbackOf returns whether an index of generation g (nil: never
// published) can be rolled back at now, lock being the lock a rebuild holds
// on it ("" for none). The order is the rollback's: it refuses while the
// lock is held, then when an index keeps no generation.
func rollbackOf(g *generation, lock string, now time.Time) rollbackState {
	switch {
	case g == nil:
		return rollbackState{WhyNot: rollbackNeverPublished}
	case g.Prev == nil:
		return rollbackState{WhyNot: rollbackNoneKept}
	case !g.PrevUntil.After(now):
		return rollbackState{WhyNot: rollbackExpired}
	case lock != "":
		return rollbackState{WhyNot: rollbackLocked}
	}
	return rollbackState{Possible: true, Until: g.PrevUntil}
}

// String formats r in tables: "yes", or "no: " and the reason.
func (r rollbackState) String() string {
	if r.Possible {
		return "yes"
	}
	switch r.WhyNot {
	case rollbackNeverPublished:
		return "no: never published"
	case rollbackNoneKept:
		return "no: none kept"
	case rollbackExpired:
		return "no: expired"
	case rollbackLocked:
		return "no: rebuild in progress"
	case rollbackBaseOwned:
		return "no: base is another index's"
	}
	return "no"
}

// describeIndexes returns the indexes of metas (meta key -> base), and of
// genKeys (registry or pointer key -> base), sorted by key, with one
// pipelined HGETALL per meta and, for an index with a registry or a
// pointer, its generations read as readGenStatus does, with grace. held
// are the lock keys held (by key). A meta that is gone since the scan, or
// is not a hash with a generation (not keyswap's), is left out, unless
// the index has a registry or a pointer. The live key of a base that two
// live keys share is the one its owner stamp names (resolveLive), or the
// index is marked Ambiguous.
func describeIndexes(ctx context.Context, client rueidis.Client, metas, genKeys map[string]string, held map[string]bool, now time.Time, grace time.Duration) ([]indexStatus, error) {
	ks := slices.Sorted(maps.Keys(metas))
	found := make([]foundKey, 0, len(metas)+len(genKeys))
	for _, k := range ks {
		found = append(found, foundKey{key: k, base: metas[k], keyOf: keys.MetaKey[bool]})
	}
	for k, base := range genKeys {
		found = append(found, foundKey{key: k, base: base, keyOf: genKeyOf(k)})
	}
	owners, err := resolveLive(ctx, client, found)
	if err != nil {
		return nil, err
	}
	// The bases of the indexes in Generations mode.
	genBases := map[string]bool{}
	for _, base := range genKeys {
		genBases[base] = true
	}
	cmds := make(rueidis.Commands, len(ks))
	for i, k := range ks {
		cmds[i] = client.B().Hgetall().Key(k).Build()
	}
	out := []indexStatus{}
	for i, res := range client.DoMulti(ctx, cmds...) {
		m, err := res.AsStrMap()
		if isWrongType(err) {
			continue // a key of another type: not a meta of keyswap's
		}
		if err != nil {
			return nil, fmt.Errorf("HGETALL %s: %w", displayKey(ks[i]), err)
		}
		g, ok := parseMeta(m)
		if !ok {
			continue
		}
		lock := keys.LockKeyForBase(metas[ks[i]])
		if !held[lock] {
			lock = ""
		}
		o := owners[ks[i]]
		if o.Ambiguous != nil && o.Ambiguous.NoStamp && !genBases[metas[ks[i]]] {
			// Only runs in Generations mode write a stamp: an index
			// that only ever rebuilt in place has none, and no
			// generation whose keys hang off its name. It is named as
			// before the stamp, without keyswap's tag, the common
			// spelling.
			o.Ambiguous = nil
		}
		ix := indexStatus{Key: o.Live, MetaKey: ks[i], Generation: &g,
			LockKey: lock, Rollback: rollbackOf(&g, lock, now), Ambiguous: o.Ambiguous}
		if group, live, ok := groupOf(metas[ks[i]]); ok {
			ix.Key, ix.Group = live, group
		}
		out = append(out, ix)
	}
	// The indexes in Generations mode without a meta of keyswap's, by the
	// registry's or the pointer's name.
	listed := map[string]bool{}
	for _, ix := range out {
		listed[metas[ix.MetaKey]] = true
	}
	for _, k := range slices.Sorted(maps.Keys(genKeys)) {
		base := genKeys[k]
		if listed[base] {
			continue
		}
		listed[base] = true
		o := owners[k]
		live := o.Live
		var group string
		if g, l, ok := groupOf(base); ok {
			live, group = l, g
		}
		lock := keys.LockKeyForBase(base)
		if !held[lock] {
			lock = ""
		}
		out = append(out, indexStatus{Key: live, Group: group, MetaKey: keys.MetaKey(live, namesOf(client, group)), LockKey: lock, Rollback: rollbackOf(nil, lock, now),
			Ambiguous: o.Ambiguous})
	}
	slices.SortFunc(out, func(a, b indexStatus) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), strings.Compare(a.MetaKey, b.MetaKey))
	})
	withGens := make([]bool, len(out))
	for i, ix := range out {
		base, ok := metas[ix.MetaKey]
		if !ok {
			base = keys.Base(ix.Key, namesOf(client, ix.Group))
		}
		withGens[i] = genBases[base]
	}
	if err := addGenerations(ctx, client, out, withGens, grace); err != nil {
		return nil, err
	}
	return out, nil
}

// name returns the index's key for the output, with its group if any, or
// why it may be another's.
func (ix indexStatus) name() string {
	switch {
	case ix.Ambiguous != nil:
		return displayKey(ix.Key) + " (" + ix.Ambiguous.note() + ")"
	case ix.BaseOwner != "":
		return displayKey(ix.Key) + " (rebuilt in place: its base is that of " + displayKey(ix.BaseOwner) + ", whose stamp it holds)"
	case ix.Group != "":
		return displayKey(ix.Key) + " (group " + displayKey(ix.Group) + ")"
	}
	return displayKey(ix.Key)
}

// genKeyOf returns how the kind of k, a registry or a pointer of
// Generations mode, is named from a live key.
func genKeyOf(k string) func(live string, cluster bool) string {
	if strings.HasSuffix(k, keys.PointerSuffix) {
		return keys.PointerKey[bool]
	}
	return keys.RegistryKey[bool]
}

// groupOf returns the group and the index of base when base is that of an
// index in a group (keys.ParseGroupBase) naming a key keyswap rebuilds: a
// name read from the keyspace is checked before it is trusted, and one
// that fails is shown as it is.
func groupOf(base string) (group, live string, ok bool) {
	group, live, ok = keys.ParseGroupBase(base)
	if !ok || keys.CheckGroup(group) != nil || live == "" || keys.Reserved(live) {
		return "", "", false
	}
	return group, live, true
}
