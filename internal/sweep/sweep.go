// Package sweep decides which keys the sweep deletes, for store.Sweep and
// for the keyswap command, so that both apply one rule.
package sweep

import (
	"context"
	"errors"
	"maps"
	"slices"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// Rule is what the sweep deletes.
type Rule struct {
	// Cutoff is the Unix time a temp key's timestamp must be strictly older
	// than.
	Cutoff int64
	// Legacy also matches the legacy shape "<key>:rebuild:<digits>", which
	// keyswap does not make (Familia did) and which application keys can
	// have, such as "ci:rebuild:12345".
	Legacy bool
}

// Parse returns the base and timestamp of key if it has a temp key's
// shape under r: the current one (with its nonce), or with Legacy the
// legacy one too.
func (r Rule) Parse(key string) (base string, unix int64, ok bool) {
	if r.Legacy {
		return keys.ParseTempKey(key)
	}
	return keys.ParseCurrentTempKey(key)
}

// Orphans returns the keys among candidates that the sweep deletes, checked
// in this order:
//
//  1. it has a temp key's shape (see Rule.Parse);
//  2. no rebuild lock exists for its base, nor for any ':'-separated prefix
//     of its base (a SetIndex family locks its prefix, while its buckets'
//     temp keys derive from the bucket keys below it);
//  3. it has no TTL (TTL is exactly -1), so it would never clean itself up;
//  4. its timestamp is strictly older than the cutoff.
//
// It reads through client, which may be a cluster client.
func Orphans(ctx context.Context, client rueidis.Client, candidates []string, r Rule) ([]string, error) {
	type temp struct {
		key   string
		unix  int64
		locks []string
	}
	var temps []temp
	lockSet := map[string]bool{}
	for _, k := range candidates {
		base, unix, ok := r.Parse(k)
		if !ok {
			continue
		}
		t := temp{key: k, unix: unix, locks: keys.VetoLocks(base)}
		for _, l := range t.locks {
			lockSet[l] = true
		}
		temps = append(temps, t)
	}
	if len(temps) == 0 {
		return nil, nil
	}

	lockKeys := slices.Sorted(maps.Keys(lockSet))
	cmds := make(rueidis.Commands, 0, len(lockKeys))
	for _, l := range lockKeys {
		cmds = append(cmds, client.B().Exists().Key(l).Build())
	}
	held := map[string]bool{}
	for i, res := range client.DoMulti(ctx, cmds...) {
		n, err := res.AsInt64()
		if err != nil {
			return nil, err
		}
		held[lockKeys[i]] = n > 0
	}
	unlocked := temps[:0]
	for _, t := range temps {
		if !slices.ContainsFunc(t.locks, func(l string) bool { return held[l] }) {
			unlocked = append(unlocked, t)
		}
	}

	cmds = cmds[:0]
	for _, t := range unlocked {
		cmds = append(cmds, client.B().Ttl().Key(t.key).Build())
	}
	var doomed []string
	for i, res := range client.DoMulti(ctx, cmds...) {
		ttl, err := res.AsInt64()
		if err != nil {
			return nil, err
		}
		if ttl == -1 && unlocked[i].unix < r.Cutoff {
			doomed = append(doomed, unlocked[i].key)
		}
	}
	return doomed, nil
}

// Chunk bounds the keys per SCAN page and per UNLINK.
const Chunk = 500

// Unlink deletes ks through client, in chunks of keys that share a hash
// slot (a multi-key command may not cross slots on a cluster).
func Unlink(ctx context.Context, client rueidis.Client, ks []string) error {
	cluster := client.Mode() == rueidis.ClientModeCluster
	groups := map[uint16][]string{}
	for _, k := range ks {
		slot := uint16(0)
		if cluster {
			slot = keys.Slot(k)
		}
		groups[slot] = append(groups[slot], k)
	}
	var cmds rueidis.Commands
	for _, slot := range slices.Sorted(maps.Keys(groups)) {
		for chunk := range slices.Chunk(groups[slot], Chunk) {
			cmds = append(cmds, client.B().Unlink().Key(chunk...).Build())
		}
	}
	var errs []error
	for _, res := range client.DoMulti(ctx, cmds...) {
		errs = append(errs, res.Error())
	}
	return errors.Join(errs...)
}
