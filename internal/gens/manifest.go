package gens

import (
	"context"
	"fmt"
	"strings"

	"github.com/keyswap/keyswap/internal/keys"
)

// listed reports whether generation g's manifest can stand for a SCAN:
// g's keys share the registry's slot, the sweep is not its run's own
// (RemoveOwn), g was published (it is retired: its run wrote everything
// and flipped to it), and its manifest's set holds keys.ManifestListed
// (its run listed every key it wrote, in the transaction of each write,
// and so did Apply while g was current). A generation made by a run that
// did not list its keys, one of a run that crashed or failed before its
// flip (building, or retired:0 by its own discard), a manifest or a list of
// another type (not keyswap's), and a list that is gone (evicted, or
// deleted: its keys would be found by nothing else) are scanned.
func (s *sweeper) listed(ctx context.Context, g int64, st State, sameSlot bool) (bool, error) {
	if !sameSlot || s.own || st.Kind != Retired || st.RetiredAt.UnixMilli() == 0 {
		return false, nil
	}
	m, list := keys.ManifestKey(s.idx.Live, s.names(), g), keys.ManifestListKey(s.idx.Live, s.names(), g)
	res := s.client.DoMulti(ctx, s.client.B().Sismember().Key(m).Member(keys.ManifestListed).Build(), s.client.B().Type().Key(list).Build())
	ok, err := res[0].AsBool()
	if isRedisErr(err) {
		return false, nil // not a set: not keyswap's manifest
	}
	if err != nil {
		return false, fmt.Errorf("SISMEMBER %s: %w", m, err)
	}
	typ, err := res[1].ToString()
	if err != nil {
		return false, fmt.Errorf("TYPE %s: %w", list, err)
	}
	return ok && typ == "list", nil
}

// byManifest deletes the keys of generation g that its manifest lists:
// its list (keys.ManifestListKey, the run's writes) read with LRANGE,
// manifestPage chunks of opts.Unlink members a call, then its set (keys.ManifestKey, Apply's
// writes) read with SSCAN COUNT opts.ScanCount, in chunks of opts.Unlink.
// A member is deleted only if it has the shape of a key of g
// (keys.GenPrefix): the manifest is a list and a set that anyone may
// write, and a member naming another key, or a key of another generation,
// is skipped.
//
// It streams: it holds a page of members and a chunk of keys at a time,
// whatever the size of the generation, and remembers no key it deleted. A
// key listed twice (in the list and the set, or twice in one) is sent
// twice; the second UNLINK finds it gone and replies 0, so the keys
// deleted are counted once, from UNLINK's replies. Nothing else writes a
// retired generation, so a key once deleted stays gone.
func (s *sweeper) byManifest(ctx context.Context, g int64, st State) (int64, Reason, error) {
	m := &manifestRead{s: s, g: g, st: st, prefix: keys.GenPrefix(s.idx.Live, g)}
	list, set := keys.ManifestListKey(s.idx.Live, s.names(), g), keys.ManifestKey(s.idx.Live, s.names(), g)
	step := int64(s.opts.Unlink) * manifestPage
	n, err := s.client.Do(ctx, s.client.B().Llen().Key(list).Build()).AsInt64()
	if err != nil {
		return 0, "", fmt.Errorf("LLEN %s: %w", list, err)
	}
	s.listLen = n
	for at := int64(0); ; at += step {
		page, err := s.client.Do(ctx, s.client.B().Lrange().Key(list).Start(at).Stop(at+step-1).Build()).AsStrSlice()
		if err != nil {
			return m.total, "", fmt.Errorf("LRANGE %s: %w", list, err)
		}
		if reason, err := m.add(ctx, page, false); err != nil || reason != "" {
			return m.total, reason, err
		}
		if int64(len(page)) < step {
			break
		}
	}
	for cursor := uint64(0); ; {
		e, err := s.client.Do(ctx, s.client.B().Sscan().Key(set).Cursor(cursor).Count(s.opts.ScanCount).Build()).AsScanEntry()
		if err != nil {
			return m.total, "", fmt.Errorf("SSCAN %s: %w", set, err)
		}
		if reason, err := m.add(ctx, e.Elements, false); err != nil || reason != "" {
			return m.total, reason, err
		}
		if cursor = e.Cursor; cursor == 0 {
			break
		}
	}
	reason, err := m.add(ctx, nil, true)
	s.opts.Logger.Debug("keyswap: generation's manifest read", "index", s.idx.Live, "generation", g, "members", m.members, "deleted", m.total)
	return m.total, reason, err
}

// manifestPage is how many chunks of opts.Unlink keys one LRANGE of a
// manifest's list reads: a round trip saved for each chunk but the first,
// for a server time of about 20 µs per chunk's members.
const manifestPage = 16

// manifestRead is the reading of one generation's manifest by byManifest.
type manifestRead struct {
	s       *sweeper
	g       int64
	st      State
	prefix  string   // of the generation's keys
	pending []string // keys to delete: less than a chunk between pages
	total   int64    // keys deleted
	members int      // members of the generation's shape, repeats included
}

// add takes the members of a page of the manifest, and deletes the pending
// keys in chunks of opts.Unlink; all deletes them all.
func (m *manifestRead) add(ctx context.Context, members []string, all bool) (Reason, error) {
	for _, k := range members {
		if strings.HasPrefix(k, m.prefix) && len(k) > len(m.prefix) {
			m.pending = append(m.pending, k)
			m.members++
		}
	}
	s := m.s
	for len(m.pending) >= s.opts.Unlink || (all && len(m.pending) > 0) {
		chunk := m.pending[:min(len(m.pending), s.opts.Unlink)]
		n, reason, err := s.chunk(ctx, m.g, m.st, chunk, true)
		m.total += n
		if err != nil || reason != "" {
			return reason, err
		}
		s.progress(m.g, m.total, n)
		// Keep what is left at the front, so that the slice holds less
		// than two pages at a time.
		m.pending = m.pending[:copy(m.pending, m.pending[len(chunk):])]
	}
	return "", nil
}
