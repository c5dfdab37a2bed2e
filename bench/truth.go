package main

import (
	"context"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

// verifyScanCount is the COUNT of the scans that read a live key whole to
// compare it with the truth.
const verifyScanCount = 5000

// truth is the source of truth of the online section, as the application
// (the writers) keeps it in memory: the dataset d, where each item that was
// changed since holds the value last committed.
//
// It costs what the changes cost, not what the dataset does: items that
// never changed are generated again from their index when read.
type truth struct {
	d       dataset
	mu      sync.Mutex
	changed map[int]item // by index: the items committed since d
}

// newTruth returns the truth of d, unchanged.
func newTruth(d dataset) *truth { return &truth{d: d, changed: map[int]item{}} }

// commit commits a change to item i: change returns its new value from its
// current one. It returns both, for the Update that applies it.
func (t *truth) commit(i int, change func(old item) item) (old, new item) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, ok := t.changed[i]
	if !ok {
		old = t.d.item(i)
	}
	new = change(old)
	t.changed[i] = new
	return old, new
}

// changes returns how many items were changed.
func (t *truth) changes() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.changed)
}

// view returns the truth as it stands now, item by index: a snapshot that
// later commits leave alone.
func (t *truth) view() func(i int) item {
	t.mu.Lock()
	changed := maps.Clone(t.changed)
	t.mu.Unlock()
	return func(i int) item {
		if it, ok := changed[i]; ok {
			return it
		}
		return t.d.item(i)
	}
}

// source returns the source of a run: the truth as it stands when the run
// pulls its first item, in index order, as a query of a database reads a
// snapshot. Run calls its source after it took its locks, so every change
// committed after the snapshot is applied while the run holds them, and
// logged for it.
func (t *truth) source() sources.Source[item] {
	return func(context.Context) iter.Seq2[item, error] {
		return func(yield func(item, error) bool) {
			t.mu.Lock()
			changed := maps.Clone(t.changed)
			t.mu.Unlock()
			i := 0
			for it := range t.d.all() {
				if c, ok := changed[i]; ok {
					it = c
				}
				i++
				if !yield(it, nil) {
					return
				}
			}
		}
	}
}

// index returns the index that member m names, if it is within the
// dataset. The caller still compares m with that item's member: "user:42"
// names item 42 without being its member.
func (t *truth) index(m string) (int, bool) {
	digits, ok := strings.CutPrefix(m, t.d.prefix()+":")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(digits)
	if err != nil || i < 0 || i >= t.d.n {
		return 0, false
	}
	return i, true
}

// verify checks that the live keys of w hold exactly the truth, entry by
// entry: every item's hash value, score, set member and bucket, with no
// entry missing, out of date (a lost change) or left over (a stale entry);
// and that the server holds no key under keyPrefix but those keys and
// generation records, so no temp key, lock, record or log is left. Nobody
// may write meanwhile.
func (t *truth) verify(ctx context.Context, c rueidis.Client, w workload) error {
	at := t.view()
	buckets := map[string]bool{}
	for i := range t.d.n {
		buckets[at(i).bucket] = true
	}
	var want []string
	for _, tg := range w.targets {
		if tg.kind != kindIndex {
			want = append(want, tg.key)
			continue
		}
		for b := range buckets {
			want = append(want, tg.key+":"+b)
		}
	}
	got, err := scanKeys(ctx, c, keyPrefix+"*")
	if err != nil {
		return err
	}
	got = slices.DeleteFunc(got, isGeneration)
	var wrong []string
	if extra := difference(got, want); len(extra) > 0 {
		wrong = append(wrong, fmt.Sprintf("%d keys left behind: %s", len(extra), firstKeys(extra)))
	}
	if missing := difference(want, got); len(missing) > 0 {
		wrong = append(wrong, fmt.Sprintf("%d keys missing: %s", len(missing), firstKeys(missing)))
	}
	if len(wrong) > 0 {
		return fmt.Errorf("%s: %s", w.name, strings.Join(wrong, "; "))
	}
	var m mismatches
	for _, tg := range w.targets {
		seen := make([]bool, t.d.n)
		check := func(member, bucket, value string) {
			i, ok := t.index(member)
			var want item
			if ok {
				want = at(i)
			}
			if !ok || want.member != member {
				m.stale("%s holds %q, which is no item", tg.key, member)
				return
			}
			if tg.kind == kindIndex && bucket != want.bucket {
				// Stale here; and, unless it is in its own bucket too,
				// counted there as lost.
				m.stale("%s is in bucket %s of %s, want %s", member, bucket, tg.key, want.bucket)
				return
			}
			if seen[i] {
				return // a SCAN may return an entry twice
			}
			seen[i] = true
			switch tg.kind {
			case kindHash:
				if value != want.value {
					m.lost("%s[%s] = %q, want %q", tg.key, member, value, want.value)
				}
			case kindZset:
				if s, err := strconv.ParseFloat(value, 64); err != nil || s != want.score {
					m.lost("score of %s in %s = %s, want %v", member, tg.key, value, want.score)
				}
			}
		}
		switch tg.kind {
		case kindHash, kindZset, kindSet:
			err = scanEntries(ctx, c, tg, func(member, value string) { check(member, "", value) })
		case kindIndex:
			err = scanBuckets(ctx, c, tg, slices.Sorted(maps.Keys(buckets)), func(bucket, member string) { check(member, bucket, "") })
		}
		if err != nil {
			return err
		}
		for i, ok := range seen {
			if !ok {
				m.lost("%s lacks %s", tg.key, at(i).member)
			}
		}
	}
	return m.err(w.name)
}

// scanEntries reads a hash, sorted set or set whole, in chunks: each field
// and value, member and score, or member (with an empty value).
func scanEntries(ctx context.Context, c rueidis.Client, tg target, each func(member, value string)) error {
	var cursor uint64
	for {
		var cmd rueidis.Completed
		switch tg.kind {
		case kindHash:
			cmd = c.B().Hscan().Key(tg.key).Cursor(cursor).Count(verifyScanCount).Build()
		case kindZset:
			cmd = c.B().Zscan().Key(tg.key).Cursor(cursor).Count(verifyScanCount).Build()
		default:
			cmd = c.B().Sscan().Key(tg.key).Cursor(cursor).Count(verifyScanCount).Build()
		}
		e, err := c.Do(ctx, cmd).AsScanEntry()
		if err != nil {
			return fmt.Errorf("scan %s: %w", tg.key, err)
		}
		if tg.kind == kindSet {
			for _, m := range e.Elements {
				each(m, "")
			}
		} else {
			for j := 0; j+1 < len(e.Elements); j += 2 {
				each(e.Elements[j], e.Elements[j+1])
			}
		}
		if cursor = e.Cursor; cursor == 0 {
			return nil
		}
	}
}

// scanBuckets reads the given buckets of a SetIndex whole.
func scanBuckets(ctx context.Context, c rueidis.Client, tg target, buckets []string, each func(bucket, member string)) error {
	for chunk := range slices.Chunk(buckets, 100) {
		cmds := make(rueidis.Commands, len(chunk))
		for i, b := range chunk {
			cmds[i] = c.B().Smembers().Key(tg.key + ":" + b).Build()
		}
		for i, res := range c.DoMulti(ctx, cmds...) {
			ms, err := res.AsStrSlice()
			if err != nil {
				return fmt.Errorf("SMEMBERS %s:%s: %w", tg.key, chunk[i], err)
			}
			for _, m := range ms {
				each(chunk[i], m)
			}
		}
	}
	return nil
}

// difference returns the strings of a that are not in b, sorted.
func difference(a, b []string) []string {
	in := map[string]bool{}
	for _, s := range b {
		in[s] = true
	}
	var out []string
	for _, s := range a {
		if !in[s] {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// mismatches counts the entries that differ from the truth, and keeps the
// first few for the error.
type mismatches struct {
	nLost, nStale int
	first         []string
}

func (m *mismatches) lost(format string, a ...any) {
	m.nLost++
	m.note(format, a...)
}

func (m *mismatches) stale(format string, a ...any) {
	m.nStale++
	m.note(format, a...)
}

func (m *mismatches) note(format string, a ...any) {
	if len(m.first) < 5 {
		m.first = append(m.first, fmt.Sprintf(format, a...))
	}
}

// err returns nil when nothing differs.
func (m *mismatches) err(name string) error {
	if m.nLost+m.nStale == 0 {
		return nil
	}
	return fmt.Errorf("%s: %d entries missing or out of date (lost changes), %d stale entries: %s", name, m.nLost, m.nStale, strings.Join(m.first, "; "))
}
