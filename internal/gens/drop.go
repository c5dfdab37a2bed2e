package gens

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/scan"
	"github.com/redis/rueidis"
)

// ErrNoPointer reports that [DropPlain] found no pointer for its index: the
// index is in the rename-in-place shape, and its plain keys are its live
// data.
var ErrNoPointer = errors.New("the index has no pointer: its plain keys are the live index, not leftovers")

// DropResult is what [DropPlain] did.
type DropResult struct {
	// Keys is the number of keys deleted.
	Keys int64
	// Kept is the number of keys of keyswap's own shapes (keys.Reserved)
	// the scan found under the family's prefix and left alone.
	Kept int64
	// Note says why nothing was looked for, when nothing was.
	Note string
}

// dropScript deletes keys of the rename-in-place shape only while the
// index's pointer exists, so only while readers read generations: a
// rename-in-place publish deletes the pointer in the same step as it
// publishes plain keys, and after it nothing here deletes them. With a type
// it deletes only the keys of that type. Every key is in the pointer's
// slot.
//
// KEYS[1] pointer, KEYS[2..] plain keys
// ARGV[1] their type (empty for any)
// Returns the number of keys deleted, or -1 when the pointer is gone (and
// nothing changed).
var dropScript = newScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local doomed = {}
for i = 2, #KEYS do
  if ARGV[1] == '' or redis.call('TYPE', KEYS[i]).ok == ARGV[1] then
    doomed[#doomed + 1] = KEYS[i]
  end
end
if #doomed == 0 then return 0 end
return redis.call('UNLINK', unpack(doomed))
`, false)

// DropPlain deletes what is left of idx in the rename-in-place shape once
// it is published in generations: the plain key itself, or a family's
// buckets "<prefix>:<bucket>" of its Type (idx.Type, required for a
// family). It is the second half of the switch from rename-in-place to
// generations.
//
// What it deletes, and why that is safe:
//
//   - only while the index's pointer exists, checked in the same step as
//     each deletion. Readers resolve the pointer and, while it exists, read
//     the generation it names, never the plain keys: those are dead data.
//     Without a pointer, DropPlain refuses ([ErrNoPointer]) before deleting
//     anything, since the plain keys are then the live index; if a
//     rename-in-place run deletes the pointer while DropPlain runs (the
//     switch back), the next chunk is refused and DropPlain stops with
//     ErrNoPointer;
//   - for a plain index, the live key itself, which keyswap owns whole (a
//     rename-in-place publish replaces it);
//   - for a family, the keys under "<prefix>:" of the family's type, and
//     none of keyswap's own shapes (keys.Reserved: a generation's data
//     keys, locks, records, metadata, kept previous values, temp keys):
//     exactly the keys a rename-in-place publish treats as the family's
//     buckets, deleting those it did not produce. A key of another type
//     under the prefix is not the family's and stays.
//
// On a cluster the pointer of an index whose base another index owns
// (the untagged X and "{X}" share one; SPEC C104) is that index's: with
// the owner stamp naming another live key DropPlain deletes nothing and
// fails with an error matching keys.ErrGroupConflict.
//
// On a cluster a family in the plain shape always had a hash tag (the
// rename-in-place mode requires one): for an untagged prefix DropPlain
// deletes nothing and says so in Note, because keyswap never wrote such
// keys. On a cluster, the plain keys of an index of a group (Index.Group)
// outside the group's slot are refused, nothing deleted: the drop checks
// the pointer in the same step. A corrupt registry or pointer fails it
// before anything is deleted
// ([*CorruptError]). Deletion is chunked like the sweep's: SCAN COUNT
// opts.ScanCount on the prefix's master, at most opts.Unlink keys per
// command, paced by opts.Pace. Grace and Now are not used.
func DropPlain(ctx context.Context, client rueidis.Client, idx Index, opts Options) (DropResult, error) {
	const op = "drop plain keys"
	d := &dropper{client: client, idx: idx}
	o, snap, err := d.begin(ctx, opts, op)
	if err != nil {
		return d.res, err
	}
	_, tagged := keys.HashTag(idx.Live)
	if idx.Group != "" && isCluster(client) && (!idx.Family || tagged) && keys.Slot(idx.Live) != keys.Slot(snap.PointerKey) {
		// The drop script deletes a plain key only while the pointer
		// exists, in one step: it cannot when the two are in different
		// slots.
		return d.res, &protocol.Error{Op: op, Key: idx.Live, Err: fmt.Errorf("the plain keys of %s are in slot %d and the pointer of its group in slot %d, so they cannot be deleted in one step with the check of the pointer; nothing deleted: once every reader has the group, UNLINK them",
			idx.Live, keys.Slot(idx.Live), keys.Slot(snap.PointerKey))}
	}
	d.opts, d.pointer = o, snap.PointerKey
	if idx.Family && isCluster(client) && !tagged {
		d.res.Note = "the prefix has no hash tag, so on a cluster keyswap never published this family in the plain shape: nothing of it to delete"
		return d.res, nil
	}
	if err := owned(ctx, client, idx); err != nil {
		return d.res, protocol.Fail(ctx, op, idx.Live, err)
	}
	if !idx.Family {
		if err := d.drop(ctx, []string{idx.Live}, ""); err != nil {
			return d.res, protocol.Fail(ctx, op, idx.Live, err)
		}
		o.Logger.Info("keyswap: plain key dropped", "index", idx.Live, "keys", d.res.Keys)
		return d.res, nil
	}
	if err := d.family(ctx); err != nil {
		return d.res, protocol.Fail(ctx, op, idx.Live, err)
	}
	o.Logger.Info("keyswap: plain keys dropped", "index", idx.Live, "keys", d.res.Keys, "kept", d.res.Kept)
	return d.res, nil
}

// dropper is one call of DropPlain.
type dropper struct {
	client  rueidis.Client
	idx     Index
	opts    Options
	pointer string // the index's pointer key
	res     DropResult
}

// begin checks opts and the index, and reads its registry and pointer: a
// corrupt one, or no pointer, is an error naming op.
func (d *dropper) begin(ctx context.Context, opts Options, op string) (Options, Snapshot, error) {
	o, err := opts.withDefaults()
	if err == nil {
		err = d.idx.check()
	}
	if err == nil && d.idx.Family && d.idx.Type == "" {
		err = errors.New("a family needs its Type: it owns only the keys of its type under its prefix")
	}
	if err != nil {
		return o, Snapshot{}, &protocol.Error{Op: op, Key: d.idx.Live, Err: err}
	}
	snap, err := Read(ctx, d.client, d.idx)
	if err != nil {
		return o, snap, protocol.Fail(ctx, op, d.idx.Live, err)
	}
	if !snap.HasPointer {
		return o, snap, &protocol.Error{Op: op, Key: d.idx.Live, Err: fmt.Errorf("%s: %w", snap.PointerKey, ErrNoPointer)}
	}
	return o, snap, nil
}

// drop deletes ks, plain keys of the index of type typ (any when empty),
// by the drop script, after the pacer.
func (d *dropper) drop(ctx context.Context, ks []string, typ string) error {
	if err := pace(ctx, d.opts, len(ks)); err != nil {
		return err
	}
	n, err := dropScript.Exec(ctx, d.client, append([]string{d.pointer}, ks...), []string{typ}).AsInt64()
	switch {
	case err != nil:
		return err
	case n == -1:
		return fmt.Errorf("%s disappeared: %w", d.pointer, ErrNoPointer)
	case n < 0:
		return fmt.Errorf("unexpected drop script reply %d", n)
	}
	d.res.Keys += n
	if d.opts.Progress != nil {
		d.opts.Progress(Progress{Keys: d.res.Keys, Total: d.res.Keys})
	}
	return nil
}

// family deletes the family's plain buckets, found by SCAN on the prefix's
// master, but for keyswap's own shapes, which it counts in Kept.
func (d *dropper) family(ctx context.Context) error {
	prefix := d.idx.Live + ":"
	sopts := scan.Options{Match: keys.GlobEscape(prefix) + "*", Type: d.idx.Type, Count: d.opts.ScanCount, InSlot: true, Slot: keys.Slot(d.idx.Live)}
	for page, err := range scan.Pages(ctx, d.client, sopts) {
		if err != nil {
			return fmt.Errorf("SCAN %s: %w", sopts.Match, err)
		}
		page = slices.DeleteFunc(page, func(k string) bool {
			if !strings.HasPrefix(k, prefix) || len(k) == len(prefix) {
				return true
			}
			if keys.Reserved(k) {
				d.res.Kept++
				return true
			}
			return false
		})
		for chunk := range slices.Chunk(page, d.opts.Unlink) {
			if err := d.drop(ctx, chunk, d.idx.Type); err != nil {
				return err
			}
		}
	}
	return nil
}

// pace waits for opts.Pace, if any.
func pace(ctx context.Context, opts Options, n int) error {
	if opts.Pace == nil {
		return nil
	}
	return opts.Pace(ctx, n)
}

// owned returns an error matching keys.ErrGroupConflict when, on a
// cluster and outside a group, the owner stamp of idx's base names
// another live key (SPEC C104): the pointer DropPlain takes for its proof
// that idx's readers read generations is then that index's, and idx's
// plain keys may be its live data; the registry a Sweep or DryRun reads
// is that index's too, whose generations' keys hang off its own key. A stamp of another type is a
// [*CorruptError]. No stamp (a base no run in Generations mode took since
// stamps came) proves nothing either way: the drop goes on.
func owned(ctx context.Context, client rueidis.Client, idx Index) error {
	if idx.Group != "" || !isCluster(client) || !keys.Aliasable(idx.Live, true) {
		return nil
	}
	stamp := keys.OwnerKey(idx.Live, true)
	owner, err := client.Do(ctx, client.B().Get().Key(stamp).Build()).ToString()
	switch {
	case rueidis.IsRedisNil(err):
		return nil
	case isRedisErr(err):
		return &CorruptError{Key: stamp, Value: err.Error(), Problem: "the reply to its GET (keyswap makes it a string naming a live key)"}
	case err != nil:
		return fmt.Errorf("GET %s: %w", stamp, err)
	case owner == idx.Live:
	case owner != keys.Alias(idx.Live, strings.TrimSuffix(stamp, keys.OwnerSuffix)):
		return &CorruptError{Key: stamp, Value: owner, Problem: "a name that is neither " + idx.Live + " nor the other live key of its base (keyswap writes one of the two)"}
	default:
		return keys.OwnerConflict(idx.Live, owner, stamp)
	}
	return nil
}
