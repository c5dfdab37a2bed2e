package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/scan"
	"github.com/redis/rueidis"
)

// genSweep is what the sweep did (or, in a dry run, would do) to the
// generations of one index in Generations mode.
type genSweep struct {
	// Key is the index's live key, or its family's prefix (the base of
	// one found Ambiguous), and Group its group (rebuild.Options.Group),
	// empty for an index of its own.
	Key    string
	Group  string
	Family bool
	// Removed are the generations removed (would be, in a dry run), Kept
	// those kept, with why.
	Removed []genRemoved
	Kept    []genKept
	// Plain is what --plain did to the plain keys left from
	// rename-in-place by an index that has a pointer; nil without --plain
	// or a pointer.
	Plain *plainDrop
	// Err is why the index was not swept (a corrupt registry), or
	// stopped.
	Err error
}

// plainDrop is what the sweep did (or, in a dry run, would do) to the keys
// an index left in the rename-in-place shape when it switched to
// Generations mode.
type plainDrop struct {
	// Keys is the number of keys deleted; in a dry run, those that exist,
	// or nil for a family's buckets (not counted: that takes a scan).
	Keys *int64
	// Note says why nothing was looked for, when nothing was.
	Note string
}

// plainDropJSON is a plainDrop in JSON.
type plainDropJSON struct {
	Keys *int64 `json:"keys"`
	Note string `json:"note,omitempty"`
}

// dropPlain deletes with gens.DropPlain what idx, an index with a pointer,
// left in the rename-in-place shape, or, in a dry run, counts it (a plain
// key only). A family whose meta records no type was never published in
// the plain shape: nothing is looked for.
func dropPlain(ctx context.Context, client rueidis.Client, idx gens.Index, dryRun bool) (*plainDrop, error) {
	if idx.Family && idx.Type == "" {
		return &plainDrop{Note: "no plain shape recorded in its meta: nothing of it to delete"}, nil
	}
	_, tagged := keys.HashTag(idx.Live)
	if ptr := keys.PointerKey(idx.Live, namesOf(client, idx.Group)); idx.Group != "" && client.Mode() == rueidis.ClientModeCluster &&
		(!idx.Family || tagged) && keys.Slot(idx.Live) != keys.Slot(ptr) {
		return &plainDrop{Note: "its plain keys are outside its group's slot, so they cannot be deleted in one step with the check of the pointer: once every reader has the group, UNLINK them"}, nil
	}
	if dryRun {
		if idx.Family {
			return &plainDrop{}, nil
		}
		found, err := existing(ctx, client, []string{idx.Live})
		if err != nil {
			return nil, err
		}
		n := int64(0)
		if found[idx.Live] {
			n = 1
		}
		return &plainDrop{Keys: &n}, nil
	}
	res, err := gens.DropPlain(ctx, client, idx, gens.Options{})
	n := res.Keys
	return &plainDrop{Keys: &n, Note: res.Note}, err
}

// genRemoved is a generation removed.
type genRemoved struct {
	Gen   int64
	State string
	// Keys is the number of its data keys deleted; in a dry run, those
	// that exist, or nil for a family's (not counted: that takes a scan).
	Keys *int64
}

// genKept is a generation kept, and why.
type genKept struct {
	Gen    int64
	State  string
	Reason string
}

// genSweepJSON is a genSweep in sweepJSON.
type genSweepJSON struct {
	jsonKey
	Group   string           `json:"group,omitempty"`
	Family  bool             `json:"family"`
	Removed []genRemovedJSON `json:"removed"`
	Kept    []genKeptJSON    `json:"kept"`
	Plain   *plainDropJSON   `json:"plain,omitempty"`
	Error   string           `json:"error,omitempty"`
}

// genRemovedJSON is a genRemoved in JSON.
type genRemovedJSON struct {
	Gen   int64  `json:"gen"`
	State string `json:"state"`
	Keys  *int64 `json:"keys"`
}

// genKeptJSON is a genKept in JSON.
type genKeptJSON struct {
	Gen    int64  `json:"gen"`
	State  string `json:"state"`
	Reason string `json:"reason"`
}

// json returns s in JSON.
func (s genSweep) json() genSweepJSON {
	out := genSweepJSON{jsonKey: newJSONKey(s.Key), Group: s.Group, Family: s.Family, Removed: []genRemovedJSON{}, Kept: []genKeptJSON{}}
	for _, r := range s.Removed {
		out.Removed = append(out.Removed, genRemovedJSON(r))
	}
	for _, k := range s.Kept {
		out.Kept = append(out.Kept, genKeptJSON(k))
	}
	if s.Plain != nil {
		out.Plain = &plainDropJSON{Keys: s.Plain.Keys, Note: s.Plain.Note}
	}
	if s.Err != nil {
		out.Error = errorMessage(s.Err)
	}
	return out
}

// registryPattern returns the SCAN MATCH glob of the registries of the
// indexes whose temp keys pattern, the sweep's --pattern, matches: the
// pattern with ":rebuild-gens" in place of its final ":rebuild:*", or
// every registry when it does not end so (selectRegistry then decides).
func registryPattern(pattern string) string {
	if stem, ok := strings.CutSuffix(pattern, keys.TempInfix+"*"); ok {
		return stem + keys.RegistrySuffix
	}
	return "*" + keys.RegistrySuffix
}

// selectRegistry reports whether the sweep's --pattern selects the index
// whose registry has base: whether it matches the temp keys of that base,
// so that a pattern limits the sweep of generations to the indexes whose
// temp keys it sweeps.
func selectRegistry(pattern, base string) bool {
	return globMatch(pattern, base+keys.TempInfix+"0:0000000000000000")
}

// foundIndex is an index in Generations mode that the sweep found by its
// registry.
type foundIndex struct {
	gens.Index
	// Ambiguous is not nil for a registry whose base two live keys share
	// (SPEC C104) and whose owner stamp names neither: Live is then the
	// base, and the sweep leaves its generations alone.
	Ambiguous *ambiguousBase
}

// findGenIndexes scans the keyspace for the registries of generations that
// pattern selects, and returns their indexes, sorted by group and key. A
// registry whose base has a group's shape (keys.ParseGroupBase) is of the
// index named after it, in that group. One whose base two live keys share
// is of the one the base's owner stamp names (resolveLive), or Ambiguous.
func findGenIndexes(ctx context.Context, client rueidis.Client, pattern string) ([]foundIndex, error) {
	seen := map[foundIndex]bool{}
	var regs []foundKey
	for page, err := range scan.Pages(ctx, client, scan.Options{Match: registryPattern(pattern)}) {
		if err != nil {
			return nil, fmt.Errorf("scanning for registries of generations: %w", err)
		}
		for _, k := range page {
			base, ok := strings.CutSuffix(k, keys.RegistrySuffix)
			if !ok || keys.IsGenKey(k) || !selectRegistry(pattern, base) {
				continue
			}
			if group, live, ok := groupOf(base); ok {
				seen[foundIndex{Index: gens.Index{Live: live, Group: group}}] = true
				continue
			}
			if _, _, ok := keys.ParseGroupBase(base); ok {
				continue // a group's shape around a key keyswap never rebuilds
			}
			regs = append(regs, foundKey{key: k, base: base, keyOf: keys.RegistryKey[bool]})
		}
	}
	owners, err := resolveLive(ctx, client, regs)
	if err != nil {
		return nil, err
	}
	for _, r := range regs {
		o := owners[r.key]
		switch {
		case o.Ambiguous != nil:
			seen[foundIndex{Index: gens.Index{Live: r.base}, Ambiguous: o.Ambiguous}] = true
		case o.Live == "" || keys.Reserved(o.Live):
			// no index of keyswap's: gens would refuse it
		default:
			seen[foundIndex{Index: gens.Index{Live: o.Live}}] = true
		}
	}
	return slices.SortedFunc(maps.Keys(seen), func(a, b foundIndex) int {
		return cmp.Or(strings.Compare(a.Group, b.Group), strings.Compare(a.Live, b.Live))
	}), nil
}

// isFamily returns whether the index live is a family, and its type when
// its meta records one: its meta says so (a publish in rename-in-place
// recorded its type), or none of the data
// keys a plain index would have in the generations of snap exists (a
// plain index has exactly one per generation, keys.GenKey). An index
// without any data key is swept as a family: its generations' keys are
// then looked for with a scan, which finds none of a plain index's.
func isFamily(ctx context.Context, client rueidis.Client, idx gens.Index, snap gens.Snapshot) (family bool, typ string, err error) {
	live := idx.Live
	metas, err := readGroupGenerations(ctx, client, idx.Group, []string{live})
	if err != nil {
		return false, "", err
	}
	if metas[0] != nil && metas[0].FamilyType != "" {
		return true, metas[0].FamilyType, nil
	}
	ks := make([]string, 0, len(snap.Registry.Gens))
	for _, g := range snap.Registry.Sorted() {
		ks = append(ks, keys.GenKey(live, g))
	}
	found, err := existing(ctx, client, ks)
	if err != nil {
		return false, "", err
	}
	return !slices.ContainsFunc(ks, func(k string) bool { return found[k] }), "", nil
}

// sweepGenerations sweeps the generations of the indexes in Generations
// mode that pattern selects (see selectRegistry): with gens.Sweep, or, in
// a dry run, with gens.DryRun, which applies gens.Sweep's rule and deletes
// nothing. A
// corrupt registry stops the sweep of its index only (its Err), and an
// index whose base two live keys share without an owner stamp naming one
// of them is not swept (its Err, an *ambiguousBase); any other error stops
// the whole sweep, and is returned with what was done.
func sweepGenerations(ctx context.Context, client rueidis.Client, pattern string, grace time.Duration, dryRun, plain bool) ([]genSweep, error) {
	found, err := findGenIndexes(ctx, client, pattern)
	if err != nil {
		return nil, err
	}
	out := []genSweep{}
	for _, f := range found {
		idx := f.Index
		s := genSweep{Key: idx.Live, Group: idx.Group, Removed: []genRemoved{}, Kept: []genKept{}}
		if f.Ambiguous != nil {
			// Fail closed: with the other index's key the sweep would
			// find none of a generation's data keys and remove its
			// registry field and manifest, leaking the keys.
			s.Err = f.Ambiguous
			out = append(out, s)
			continue
		}
		snap, err := gens.Read(ctx, client, idx)
		if snap.InGroup != "" && errors.Is(err, keys.ErrGroupConflict) {
			// The pointer without a group holds a group's claim (SPEC
			// C102): the index's generations are the group's, found
			// under the group's names.
			continue
		}
		var typ string
		if err == nil {
			s.Family, typ, err = isFamily(ctx, client, idx, snap)
		}
		idx.Family = s.Family
		if err == nil && dryRun {
			var plan gens.Plan
			plan, err = gens.DryRun(ctx, client, idx, gens.Options{Grace: grace})
			s.plan(plan)
		}
		if err == nil && !dryRun {
			var res gens.Result
			res, err = gens.Sweep(ctx, client, idx, gens.Options{Grace: grace})
			s.record(res)
		}
		if err == nil && plain && snap.HasPointer {
			idx.Type = typ
			s.Plain, err = dropPlain(ctx, client, idx, dryRun)
		}
		if err != nil {
			s.Err = err
			out = append(out, s)
			if errors.Is(err, gens.ErrCorrupt) {
				continue
			}
			return out, err
		}
		out = append(out, s)
	}
	return out, nil
}

// plan fills s with what gens.Sweep would do, as gens.DryRun planned it.
func (s *genSweep) plan(plan gens.Plan) {
	for _, r := range plan.Remove {
		var n *int64
		if r.Keys >= 0 {
			n = &r.Keys
		}
		s.Removed = append(s.Removed, genRemoved{Gen: r.Gen, State: r.State.Raw, Keys: n})
	}
	for _, k := range plan.Keep {
		s.Kept = append(s.Kept, genKept{Gen: k.Gen, State: k.State.Raw, Reason: string(k.Reason)})
	}
}

// record fills s with res, what gens.Sweep did.
func (s *genSweep) record(res gens.Result) {
	for _, r := range res.Removed {
		n := r.Keys
		s.Removed = append(s.Removed, genRemoved{Gen: r.Gen, State: r.State.Raw, Keys: &n})
	}
	for _, k := range res.Skipped {
		s.Kept = append(s.Kept, genKept{Gen: k.Gen, State: k.State.Raw, Reason: string(k.Reason)})
	}
	slices.SortFunc(s.Kept, func(a, b genKept) int { return int(a.Gen - b.Gen) })
}

// genCounts returns the generations removed (or to remove) over ss, and
// their keys counted.
func genCounts(ss []genSweep) (gens int, keys int64) {
	for _, s := range ss {
		gens += len(s.Removed)
		for _, r := range s.Removed {
			if r.Keys != nil {
				keys += *r.Keys
			}
		}
	}
	return gens, keys
}

// name returns the index's key for the output, with its group if any.
func (s genSweep) name() string {
	if s.Group == "" {
		return displayKey(s.Key)
	}
	return displayKey(s.Key) + " (group " + displayKey(s.Group) + ")"
}
