package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// On a cluster two live keys can share a base (SPEC C104): the untagged X
// and the tagged "{X}" both have "{X}", and "a}b" has "{rbN}a}b", itself a
// tagged key whose base it is. A meta, registry or pointer that a scan
// finds names the base, not the live key, while the data keys of a
// generation hang off the live key (X:rebuild-g:G, {X}:rebuild-g:G): a
// sweep that took one index for the other would find none of the
// generation's keys and remove its registry field and manifest, leaking
// the keys. Every run in Generations mode stamps such a base with the live
// key whose base it is (<base>:rebuild-owner), and the CLI reads that
// stamp. Without a stamp, or with one it cannot trust, it does not guess
// for a command that deletes.

// foundKey is a meta, registry or pointer that a scan found, with its base
// and how its kind names it from a live key (keys.MetaKey,
// keys.RegistryKey, keys.PointerKey).
type foundKey struct {
	key, base string
	keyOf     func(live string, cluster bool) string
}

// liveCandidates returns the live keys (a family's prefixes) whose key of
// f's kind is f.key: none for a key that no live key has, one, or, on a
// cluster, two for a base that two live keys share (keys.Aliasable), the
// one spelled as the base first.
func liveCandidates(f foundKey, cluster bool) []string {
	var out []string
	for _, n := range liveNames(f.base, cluster) {
		if f.keyOf(n.name, cluster) == f.key {
			out = append(out, n.name)
		}
	}
	return out
}

// ambiguousBase is a base that two live keys share, whose owner stamp does
// not say whose it is.
type ambiguousBase struct {
	Base, Stamp string
	// Candidates are the two live keys, as liveCandidates gives them.
	Candidates []string
	// Why says what the stamp holds: nothing (NoStamp), another type, or
	// neither candidate.
	Why     string
	NoStamp bool
}

// Error says that the base's generations were left alone, and how to
// settle whose they are.
func (a *ambiguousBase) Error() string {
	return fmt.Sprintf("base %s is that of index %s and of index %s, and %s: keyswap cannot tell whose generations these are, "+
		"whose data keys hang off the index's own key; nothing removed. Run that index once in Generations mode, which stamps its base, "+
		"or, knowing which it is, SET %s to its key",
		displayKey(a.Base), displayKey(a.Candidates[0]), displayKey(a.Candidates[1]), a.Why, displayKey(a.Stamp))
}

// note returns a short note for status's tables.
func (a *ambiguousBase) note() string {
	return fmt.Sprintf("ambiguous: %s or %s, %s", displayKey(a.Candidates[0]), displayKey(a.Candidates[1]), a.Why)
}

// liveOwner is the live key of a key a scan found.
type liveOwner struct {
	// Live is the live key (a family's prefix): the only candidate, or
	// the one the base's owner stamp names. For an Ambiguous base, it is
	// a guess: the key without keyswap's tag, as status named it before
	// the stamp.
	Live string
	// Ambiguous is not nil when the base has two candidates and its owner
	// stamp names neither.
	Ambiguous *ambiguousBase
}

// resolveLive returns the live key of each of fs, by its key: the only
// candidate (liveCandidates), or, for a base two live keys share, the one
// its owner stamp names, read with one GET per such base, pipelined (on a
// cluster the stamp is in the base's slot). A base whose stamp is absent,
// of another type, or names neither candidate is Ambiguous. A key with no
// candidate (not keyswap's shape: written by hand) is given its base.
func resolveLive(ctx context.Context, client rueidis.Client, fs []foundKey) (map[string]liveOwner, error) {
	cluster := client.Mode() == rueidis.ClientModeCluster
	out := make(map[string]liveOwner, len(fs))
	shared := map[string][]string{} // base -> its two candidates
	for _, f := range fs {
		c := liveCandidates(f, cluster)
		switch len(c) {
		case 0:
			out[f.key] = liveOwner{Live: f.base}
		case 1:
			out[f.key] = liveOwner{Live: c[0]}
		default:
			shared[f.base] = c
		}
	}
	if len(shared) == 0 {
		return out, nil
	}
	bases := make([]string, 0, len(shared))
	cmds := make(rueidis.Commands, 0, len(shared))
	for b := range shared {
		bases = append(bases, b)
		cmds = append(cmds, client.B().Get().Key(b+keys.OwnerSuffix).Build())
	}
	owners := make(map[string]liveOwner, len(shared))
	for i, res := range client.DoMulti(ctx, cmds...) {
		o, err := ownerOf(bases[i], shared[bases[i]], res)
		if err != nil {
			return nil, err
		}
		owners[bases[i]] = o
	}
	for _, f := range fs {
		if o, ok := owners[f.base]; ok {
			out[f.key] = o
		}
	}
	return out, nil
}

// ownerOf returns the live key of base, which the live keys c share
// (liveCandidates, two), from res, the reply to the GET of its owner
// stamp: the candidate the stamp names, or, for a stamp that is absent,
// of another type or names neither, a guess marked Ambiguous. It returns
// an error only for a GET that Redis failed.
func ownerOf(base string, c []string, res rueidis.RedisResult) (liveOwner, error) {
	stamp := base + keys.OwnerSuffix
	v, err := res.ToString()
	var why string
	switch {
	case rueidis.IsRedisNil(err):
		why = "it has no owner stamp (a base written before keyswap kept one, or by RenameInPlace runs only)"
		return liveOwner{Live: c[len(c)-1], Ambiguous: &ambiguousBase{Base: base, Stamp: stamp, Candidates: c, Why: why, NoStamp: true}}, nil
	case isWrongType(err):
		why = "its owner stamp is not a string, a state no run leaves (not trusted)"
	case err != nil:
		return liveOwner{}, fmt.Errorf("GET %s: %w", displayKey(stamp), err)
	case slices.Contains(c, v):
		return liveOwner{Live: v}, nil
	default:
		why = fmt.Sprintf("its owner stamp names %s, neither of them (not trusted)", displayKey(v))
	}
	return liveOwner{Live: c[len(c)-1], Ambiguous: &ambiguousBase{Base: base, Stamp: stamp, Candidates: c, Why: why}}, nil
}

// readOwner returns the owner of the base of live, an index outside a
// group, read with one GET of its owner stamp, when another live key can
// have that base (keys.Aliasable: only on a cluster); ok is false, with
// nothing read, when the base is live's alone. The owner is as ownerOf
// gives it: Live is live or the other key, or, with Ambiguous, a guess.
func readOwner(ctx context.Context, client rueidis.Client, live string) (o liveOwner, ok bool, err error) {
	cluster := client.Mode() == rueidis.ClientModeCluster
	if !keys.Aliasable(live, cluster) {
		return liveOwner{}, false, nil
	}
	base := keys.Base(live, cluster)
	c := liveCandidates(foundKey{key: keys.PointerKey(live, cluster), base: base, keyOf: keys.PointerKey[bool]}, cluster)
	if len(c) != 2 {
		return liveOwner{}, false, nil // not a shape two keys share after all
	}
	o, err = ownerOf(base, c, client.Do(ctx, client.B().Get().Key(base+keys.OwnerSuffix).Build()))
	return o, err == nil, err
}

// isWrongType reports whether err is Redis's WRONGTYPE error.
func isWrongType(err error) bool {
	rerr, ok := rueidis.IsRedisErr(err)
	return ok && strings.HasPrefix(rerr.Error(), "WRONGTYPE")
}
