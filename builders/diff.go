package builders

import (
	"errors"

	"github.com/keyswap/keyswap/index"
)

// The builders of this package, but Func and Compat, maintain the index
// they build: Diff turns a change to one item into the writes that take the
// index from the old item's entries to the new one's (rebuild.Rebuilder's
// Apply). Each writes only what differs, so an update that leaves an
// item's entry as it was writes nothing.
var (
	_ index.Incremental[int] = (*hash[int])(nil)
	_ index.Incremental[int] = (*sortedSet[int])(nil)
	_ index.Incremental[int] = (*set[int])(nil)
	_ index.Incremental[int] = (*setIndex[int])(nil)
)

// Diff removes the old item's field, unless the new one has the same, and
// sets the new item's field to its value, unless it is unchanged. The
// removal happens only while the field still holds the old item's value
// (HDelIf): another item may have taken the field since, and the changes
// of two items may be applied in either order.
func (h *hash[T]) Diff(w *index.Writes, old, new *T) error {
	of, ov, oldOK, err1 := mapped2(h.fn, old)
	nf, nv, newOK, err2 := mapped2(h.fn, new)
	if err := errors.Join(err1, err2); err != nil {
		return mappingError(err)
	}
	if oldOK && (!newOK || of != nf) {
		if err := w.HDelIf(h.key, of, ov); err != nil {
			return err
		}
	}
	if newOK && (!oldOK || of != nf || ov != nv) {
		return w.HSet(h.key, nf, nv)
	}
	return nil
}

// Diff removes the old item's member, unless the new one is the same, and
// sets the new item's score, unless it is unchanged. The removal happens
// only while the member still has the old item's score (ZRemIf): another
// item may have taken the member since.
func (z *sortedSet[T]) Diff(w *index.Writes, old, new *T) error {
	om, os, oldOK, err1 := mapped2(z.fn, old)
	nm, ns, newOK, err2 := mapped2(z.fn, new)
	if err := errors.Join(err1, err2); err != nil {
		return mappingError(err)
	}
	if oldOK && (!newOK || om != nm) {
		if err := w.ZRemIf(z.key, os, om); err != nil {
			return err
		}
	}
	if newOK && (!oldOK || om != nm || os != ns) {
		return w.ZAdd(z.key, ns, nm)
	}
	return nil
}

// Diff removes the old item's member and adds the new one's, unless they
// are the same.
func (s *set[T]) Diff(w *index.Writes, old, new *T) error {
	om, oldOK, err1 := mapped1(s.fn, old)
	nm, newOK, err2 := mapped1(s.fn, new)
	if err := errors.Join(err1, err2); err != nil {
		return mappingError(err)
	}
	if oldOK && (!newOK || om != nm) {
		if err := w.SRem(s.key, om); err != nil {
			return err
		}
	}
	if newOK && (!oldOK || om != nm) {
		return w.SAdd(s.key, nm)
	}
	return nil
}

// Diff moves the item's member from the old bucket to the new one: SREM
// from the old bucket's set, SADD to the new one's, unless bucket and
// member are unchanged. A bucket whose key has the shape of keyswap's own
// keys is skipped, as Build skips it.
func (s *setIndex[T]) Diff(w *index.Writes, old, new *T) error {
	ob, om, oldOK, err1 := mapped2(s.fn, old)
	nb, nm, newOK, err2 := mapped2(s.fn, new)
	if err := errors.Join(err1, err2); err != nil {
		return mappingError(err)
	}
	same := oldOK && newOK && ob == nb && om == nm
	if oldOK && !same {
		if err := skipReserved(w.SRem(s.prefix+":"+ob, om)); err != nil {
			return err
		}
	}
	if newOK && !same {
		return skipReserved(w.SAdd(s.prefix+":"+nb, nm))
	}
	return nil
}

// skipReserved drops an error matching index.ErrReservedKey: the entry
// is skipped (and logged by the Rebuilder).
func skipReserved(err error) error {
	if errors.Is(err, index.ErrReservedKey) {
		return nil
	}
	return err
}

// mapped1 applies fn to *v, or reports false for a nil v.
func mapped1[T, A any](fn func(T) (A, bool, error), v *T) (a A, ok bool, err error) {
	if v == nil {
		return a, false, nil
	}
	return fn(*v)
}

// mapped2 applies fn to *v, or reports false for a nil v.
func mapped2[T, A, B any](fn func(T) (A, B, bool, error), v *T) (a A, b B, ok bool, err error) {
	if v == nil {
		return a, b, false, nil
	}
	return fn(*v)
}
