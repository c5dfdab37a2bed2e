package reader

import (
	"context"
	"fmt"
	"strings"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// stamped reports whether the pointer of the index name counts as name's
// only when the owner stamp of its base names name (SPEC C104): on a
// cluster, outside a group, where another live key can have name's base
// (keys.Aliasable: X and "{X}" share "{X}:rebuild-ptr"). An index that
// rebuilds in place writes no stamp: the first Generations run of the
// other key stamps the base with its own name and sets the pointer, which
// the in-place index's readers would otherwise follow to the other's data.
// The pointer of a group ("{group}:rebuild-group:" + name) is name's
// alone, and so is every pointer on a standalone server: those resolve
// with one cached GET, as before.
func (r *Reader) stamped(name string) bool {
	return r.cluster.Group == "" && keys.Aliasable(name, r.cluster.Cluster)
}

// stampOf returns the owner stamp of the base whose pointer is ptr:
// keys.OwnerKey, without computing the base again.
func stampOf(ptr string) string {
	return strings.TrimSuffix(ptr, keys.PointerSuffix) + keys.OwnerSuffix
}

// getStamped reads ptr and stamp, two keys of one slot, as get reads one:
// through the client-side cache in one DoMultiCache (one round trip on a
// miss, none on a hit), or without it in one DoMulti.
func (r *Reader) getStamped(ctx context.Context, ptr, stamp string) (pres, sres rueidis.RedisResult) {
	b := r.client.B()
	if !r.noMulti.Load() {
		res := r.client.DoMultiCache(ctx, rueidis.CT(b.Get().Key(ptr).Cache(), r.ttl), rueidis.CT(b.Get().Key(stamp).Cache(), r.ttl))
		if !r.aborted(res...) {
			r.note(res[0])
			return res[0], res[1]
		}
	}
	res := r.client.DoMulti(ctx, b.Get().Key(ptr).Build(), b.Get().Key(stamp).Build())
	return res[0], res[1]
}

// owned returns the generation of the index name from pres and sres, the
// replies to the GETs of its pointer ptr and of the owner stamp of its
// base, stamp, read together, where another live key can share that
// pointer (SPEC C104):
//
//   - the stamp names name: the pointer is name's, read as parse reads it;
//   - it names the other live key of the base: the pointer (a generation,
//     or a group's claim) is that index's, and name's data is at its plain
//     key, generation 0 (name rebuilds in place);
//   - it is absent: without a pointer, generation 0; with one, whose it is
//     cannot be told, and the reader does not guess: an error matching
//     ErrBadPointer that names the stamp and how to write it. Every
//     Generations run, and every group's claim, writes the stamp before it
//     sets the pointer, so this is a pointer written before the stamp
//     existed, or a stamp deleted by hand;
//   - it names neither key, or is not a string: an error
//     matching ErrBadPointer naming the stamp (no run writes either).
func owned(pres, sres rueidis.RedisResult, op, name, ptr, stamp string) (int64, error) {
	owner, err := sres.ToString()
	switch {
	case rueidis.IsRedisNil(err):
		v, err := pres.ToString()
		if rueidis.IsRedisNil(err) {
			return 0, nil
		}
		if err != nil {
			return 0, &Error{Op: op, Key: ptr, Err: err}
		}
		return 0, &Error{Op: op, Key: stamp, Err: fmt.Errorf("%w: %s holds %s, but the owner stamp %s that says whose it is is absent: on a cluster %s and another live key share that pointer, and the reader does not guess which one's generation it is. A Generations run of the index whose pointer it is writes the stamp; or SET %s to its live key (%s, if it is this index's)",
			ErrBadPointer, ptr, quote(v), stamp, name, stamp, name)}
	case err != nil:
		if rerr, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(rerr.Error(), "WRONGTYPE") {
			return 0, &Error{Op: op, Key: stamp, Err: fmt.Errorf("%w: the owner stamp %s is not a string (%w), a state no run leaves (written by hand): it names the live key whose base, and pointer %s, it is. If it is %s's, DEL %s and SET %s %s",
				ErrBadPointer, stamp, err, ptr, name, stamp, stamp, name)}
		}
		return 0, &Error{Op: op, Key: stamp, Err: err}
	case owner == name:
		return parse(pres, op, ptr)
	case owner == keys.Alias(name, strings.TrimSuffix(ptr, keys.PointerSuffix)):
		// The other index's pointer: its generations and claims are not
		// name's, and name, which a run of its own would have found the
		// base taken for, rebuilds in place.
		return 0, nil
	default:
		return 0, &Error{Op: op, Key: stamp, Err: fmt.Errorf("%w: the owner stamp %s holds %s, which is neither %s nor the other live key of its base, a state no run leaves (written by hand). If %s is %s's, SET %s %s",
			ErrBadPointer, stamp, quote(owner), name, ptr, name, stamp, name)}
	}
}
