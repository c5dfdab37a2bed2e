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
// and flipped to it), and its manifest holds keys.ManifestListed (its run
// listed every key it wrote, in the transaction of each write, and so did
// Apply while g was current). A generation made by a run that did not
// list its keys, one of a run that crashed or failed before its flip, and
// a manifest of another type (not keyswap's) are scanned.
func (s *sweeper) listed(ctx context.Context, g int64, st State, sameSlot bool) (bool, error) {
	if !sameSlot || s.own || st.Kind != Retired {
		return false, nil
	}
	m := keys.ManifestKey(s.idx.Live, s.cluster, g)
	ok, err := s.client.Do(ctx, s.client.B().Sismember().Key(m).Member(keys.ManifestListed).Build()).AsBool()
	if isRedisErr(err) {
		return false, nil // not a set: not keyswap's manifest
	}
	if err != nil {
		return false, fmt.Errorf("SISMEMBER %s: %w", m, err)
	}
	return ok, nil
}

// byManifest deletes the keys of generation g that its manifest lists,
// read with SSCAN COUNT opts.ScanCount, in chunks of opts.Unlink, but for
// those in done (deleted by name already: nothing writes a retired
// generation). A member is deleted only if it has the shape of a key of g
// (keys.GenPrefix): the manifest is a set anyone may write, and a member
// naming another key, or a key of another generation, is skipped.
func (s *sweeper) byManifest(ctx context.Context, g int64, st State, done map[string]bool) (int64, Reason, error) {
	m := keys.ManifestKey(s.idx.Live, s.cluster, g)
	prefix := keys.GenPrefix(s.idx.Live, g)
	if done == nil {
		done = map[string]bool{}
	}
	var total int64
	var pending []string
	flush := func(all bool) (Reason, error) {
		for len(pending) >= s.opts.Unlink || (all && len(pending) > 0) {
			chunk := pending[:min(len(pending), s.opts.Unlink)]
			n, reason, err := s.chunk(ctx, g, st, chunk, true)
			total += n
			if err != nil || reason != "" {
				return reason, err
			}
			s.progress(g, total, n)
			pending = pending[len(chunk):]
		}
		return "", nil
	}
	listed := 0
	for cursor := uint64(0); ; {
		e, err := s.client.Do(ctx, s.client.B().Sscan().Key(m).Cursor(cursor).Count(s.opts.ScanCount).Build()).AsScanEntry()
		if err != nil {
			return total, "", fmt.Errorf("SSCAN %s: %w", m, err)
		}
		for _, k := range e.Elements {
			if strings.HasPrefix(k, prefix) && len(k) > len(prefix) && !done[k] {
				done[k] = true // SSCAN may return a member twice
				pending = append(pending, k)
				listed++
			}
		}
		if reason, err := flush(false); err != nil || reason != "" {
			return total, reason, err
		}
		if cursor = e.Cursor; cursor == 0 {
			break
		}
	}
	reason, err := flush(true)
	s.opts.Logger.Debug("keyswap: generation's manifest read", "index", s.idx.Live, "generation", g, "listed", listed, "deleted", total)
	return total, reason, err
}
