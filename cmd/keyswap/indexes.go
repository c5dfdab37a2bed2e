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
	}
	return "no"
}

// indexKey returns the live key (a family's prefix) whose meta is metaKey,
// of base: base itself on a standalone server; on a cluster, base without
// the hash tag keyswap put around the live key, when that gives metaKey
// back ("{users:by-email}" is users:by-email's). A base such as
// "{users:by-email}" also stands for a live key spelled with the braces,
// which shares the meta: the name without them is given.
func indexKey(metaKey, base string, cluster bool) string {
	return liveOf(metaKey, base, cluster, keys.MetaKey)
}

// liveOf returns the live key (a family's prefix) whose key of one kind,
// as keyOf names it (keys.MetaKey, keys.RegistryKey, keys.PointerKey), is
// key, of base, as indexKey does for metas.
func liveOf(key, base string, cluster bool, keyOf func(live string, cluster bool) string) string {
	names := liveNames(base, cluster)
	for i := len(names) - 1; i >= 0; i-- {
		if keyOf(names[i].name, cluster) == key {
			return names[i].name
		}
	}
	return base
}

// describeIndexes returns the indexes of metas (meta key -> base), and of
// genKeys (registry or pointer key -> base), sorted by key, with one
// pipelined HGETALL per meta and, for an index with a registry or a
// pointer, its generations read as readGenStatus does, with grace. held
// are the lock keys held (by key). A meta that is gone since the scan, or
// is not a hash with a generation (not keyswap's), is left out, unless
// the index has a registry or a pointer.
func describeIndexes(ctx context.Context, client rueidis.Client, metas, genKeys map[string]string, held map[string]bool, now time.Time, grace time.Duration) ([]indexStatus, error) {
	cluster := client.Mode() == rueidis.ClientModeCluster
	ks := slices.Sorted(maps.Keys(metas))
	cmds := make(rueidis.Commands, len(ks))
	for i, k := range ks {
		cmds[i] = client.B().Hgetall().Key(k).Build()
	}
	out := []indexStatus{}
	for i, res := range client.DoMulti(ctx, cmds...) {
		m, err := res.AsStrMap()
		if rerr, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(rerr.Error(), "WRONGTYPE") {
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
		ix := indexStatus{Key: indexKey(ks[i], metas[ks[i]], cluster), MetaKey: ks[i], Generation: &g,
			LockKey: lock, Rollback: rollbackOf(&g, lock, now)}
		if group, live, ok := groupOf(metas[ks[i]]); ok {
			ix.Key, ix.Group = live, group
		}
		out = append(out, ix)
	}
	// The indexes in Generations mode: their bases, and those without a
	// meta of keyswap's, by the registry's or the pointer's name.
	genBases, listed := map[string]bool{}, map[string]bool{}
	for _, ix := range out {
		listed[metas[ix.MetaKey]] = true
	}
	for _, k := range slices.Sorted(maps.Keys(genKeys)) {
		base := genKeys[k]
		if genBases[base] {
			continue
		}
		genBases[base] = true
		if listed[base] {
			continue
		}
		keyOf := keys.RegistryKey[bool]
		if strings.HasSuffix(k, keys.PointerSuffix) {
			keyOf = keys.PointerKey
		}
		live := liveOf(k, base, cluster, keyOf)
		var group string
		if g, l, ok := groupOf(base); ok {
			live, group = l, g
		}
		lock := keys.LockKeyForBase(base)
		if !held[lock] {
			lock = ""
		}
		out = append(out, indexStatus{Key: live, Group: group, MetaKey: keys.MetaKey(live, namesOf(client, group)), LockKey: lock, Rollback: rollbackOf(nil, lock, now)})
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

// name returns the index's key for the output, with its group if any.
func (ix indexStatus) name() string {
	if ix.Group == "" {
		return displayKey(ix.Key)
	}
	return displayKey(ix.Key) + " (group " + displayKey(ix.Group) + ")"
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
