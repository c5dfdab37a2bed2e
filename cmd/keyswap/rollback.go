package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	krun "github.com/keyswap/keyswap/internal/protocol"
	"github.com/redis/rueidis"
)

const rollbackUsage = `Usage: keyswap rollback [flags] <key>...

Rollback swaps the previous generation of each index back in, all in one
atomic step: the values that the last publish replaced, kept because it
was published with Options.KeepPrevious, become live again. For a family
(<key> is then its prefix), the buckets that publish deleted come back and
those it created go. Each index's generation goes back to the previous one,
and the values rolled back are kept in turn, for what is left of the time
KeepPrevious gave them: a second rollback rolls forward again. Changes
applied to the live keys since the publish are in the generation rolled
back, not in the one restored.

An index published in Generations mode (rebuild.Options.Publish =
rebuild.Generations: it has a pointer, "<key>:rebuild-ptr") is rolled back
by a flip instead: its pointer goes back to the previous generation, which
its last publish kept with KeepPrevious (until the next publish, without a
time limit), and the generation rolled back becomes the previous one, so a
second rollback flips forward again. No data key moves: it costs the same
whatever the size of the index. The indexes of one rollback must all be in
that mode, or all in rename-in-place; a rollback that mixes them is
refused, changing nothing. It prints each index's current and previous
generation, and -json adds to each key "mode": "generations" and its
"generations", as 'keyswap status -json' gives them.

Indexes of a group (rebuild.Options.Group) are named by their keys and
the group, given with --group: their pointers, registries, metas and
locks hang off "{<group>}:rebuild-group:<key>". Without --group, such an
index has no pointer of its own and is taken for one in the
rename-in-place shape.

Whether an index is a family is read from its meta ("<key>:rebuild-gen"),
which every publish writes. The indexes of one rollback must be published
together (one rebuild.Rebuilder), or at least share a hash slot on a
cluster.

Rollback is fenced like a rebuild: it takes the indexes' locks first
(with a lease of 60s), and refuses, changing nothing, while a rebuild of
any of them is in progress. It prints each index's generation now live,
and the one kept for a roll forward; -json prints one object instead, with
the names exact:

  {
    "server": {"mode": "standalone", "addrs": ["10.0.0.5:6379"], "db": 0},
    "keys": [{
      "key": "users:by-email",        a family's prefix for a family
      "family": false,
      "generation": {"gen": 7, "at": "2025-01-02T15:04:05.123Z", "prev": 8,
                     "prev_until": "2025-01-02T16:00:00Z",
                     "rolled_back": "2025-01-02T15:04:05.123Z"}
    }]
  }

A name that is not valid UTF-8 is given instead as the standard base64 of
its bytes, in "key_base64".

Exit status: 0 once rolled back; 5 when a rebuild of one of the indexes is
in progress; 6 when one keeps no previous generation (none was kept, or
its time ran out; in Generations mode, none was kept or a publish since
retired it); 1 on an error, or for indexes of both modes at once; 2 on a
usage error. On every error nothing changed.`

// rollbackLease is the lease of the locks a rollback takes: a family's
// SCAN runs under them.
const rollbackLease = 60 * time.Second

// rollbackJSON is the -json document of 'keyswap rollback'.
type rollbackJSON struct {
	Server serverJSON  `json:"server"`
	Keys   []indexJSON `json:"keys"`
}

// rollback is the 'keyswap rollback' command.
func (c *cli) rollback(ctx context.Context, args []string) error {
	fs := newFlagSet("rollback")
	conn := addConnFlags(fs)
	asJSON := fs.Bool("json", false, "print one JSON object (described above) instead of a table")
	group := fs.String("group", "", "the `group` of the indexes, as rebuild.Options.Group names it (Generations mode)")
	lives, err := c.parse(fs, args, rollbackUsage)
	if err != nil {
		return err
	}
	if len(lives) == 0 {
		return usagef("want at least one key")
	}
	if *group != "" {
		if err := keys.CheckGroup(*group); err != nil {
			return usagef("--group: %v", err)
		}
	}
	client, err := c.connect(ctx, conn)
	if err != nil {
		return err
	}
	defer client.Close()

	what := strings.Join(lives, ", ")
	away, err := aliasedAway(ctx, client, lives)
	if err != nil {
		return fmt.Errorf("rollback %s: %w; nothing changed", what, err)
	}
	if *group == "" {
		if err := notClaimed(ctx, client, "", ours(lives, away)); err != nil {
			return fmt.Errorf("rollback %s: %w; nothing changed", what, err)
		}
	}
	before, err := readGroupGenerations(ctx, client, *group, lives)
	if err != nil {
		return fmt.Errorf("rollback %s: %w", what, err)
	}
	pointers, err := hasPointers(ctx, client, *group, lives)
	if err != nil {
		return fmt.Errorf("rollback %s: %w", what, err)
	}
	if *group == "" {
		for i := range pointers {
			// The pointer in its base is the other index's: it is in
			// the rename-in-place shape.
			pointers[i] = pointers[i] && !away[i]
		}
	}
	if *group != "" {
		// An index without the group's pointer may be another group's.
		var absent []string
		for i, p := range pointers {
			if !p && !away[i] {
				absent = append(absent, lives[i])
			}
		}
		if err := notClaimed(ctx, client, *group, absent); err != nil {
			return fmt.Errorf("rollback %s: %w; nothing changed", what, err)
		}
	}
	gen := slices.Contains(pointers, true)
	if i := slices.Index(pointers, false); gen && i >= 0 {
		return fmt.Errorf("rollback %s: %s is in the rename-in-place shape (no pointer, %s) and %s in Generations mode: one rollback flips indexes of one mode; roll them back separately; nothing changed",
			what, displayKey(lives[i]), displayKey(keys.PointerKey(lives[i], namesOf(client, *group))), displayKey(lives[slices.Index(pointers, true)]))
	}
	families := make([]string, len(lives))
	for i, g := range before {
		switch {
		case g != nil:
			families[i] = g.FamilyType // "" for a plain key
		case !gen:
			return fmt.Errorf("rollback %s: %w: keyswap never published it (it has no meta, %s); nothing changed",
				displayKey(lives[i]), krun.ErrNothingToRollBack, displayKey(keys.MetaKey(lives[i], namesOf(client, *group))))
		}
	}
	// In Generations mode a rollback is a flip back of each pointer: no
	// data key moves, so MaxKeys does not bind.
	rr := krun.NewInGroup(client, *group, nil)
	rollback := rr.Publisher.Rollback
	if gen {
		rollback = rr.Generations.GenRollback
	}
	_, err = rollback(ctx, krun.RollbackOptions{
		Op: "rollback", Key: what, Lives: lives, FamilyTypes: families, TTL: rollbackLease, Now: c.now(),
		MaxKeys: krun.DefaultMaxKeys,
	})
	if errors.Is(err, krun.ErrInProgress) {
		return fmt.Errorf("%w; nothing changed: roll back once it has ended, or end it ('keyswap cancel', 'keyswap discard')", err)
	}
	if err != nil {
		return err
	}
	after, err := readGroupGenerations(ctx, client, *group, lives)
	if err != nil {
		return fmt.Errorf("rolled back %s, but reading the generations failed: %w", what, err)
	}
	idx := make([]keyGeneration, len(lives))
	for i, l := range lives {
		idx[i] = keyGeneration{Key: l, Family: families[i] != "", Generation: after[i]}
	}
	srv := serverOf(client, conn.used)
	if gen {
		return c.reportGenRollback(ctx, client, *group, srv, idx, *asJSON)
	}
	if *asJSON {
		return writeJSON(c.stdout, rollbackJSON{Server: srv.json(), Keys: indexesJSON(idx)})
	}
	fmt.Fprintf(c.stdout, "rolled back %s; 'keyswap rollback' again rolls forward while PREV is kept\n\n", indexes(len(lives)))
	return writeGenerations(c, idx)
}

// reportGenRollback prints the indexes idx that a rollback in Generations
// mode flipped on srv, with their generations, read again from their
// registries, as a table or, with asJSON, as rollbackJSON.
func (c *cli) reportGenRollback(ctx context.Context, client rueidis.Client, group string, srv server, idx []keyGeneration, asJSON bool) error {
	gs := make([]*genStatus, len(idx))
	for i, ix := range idx {
		var err error
		if gs[i], err = readGenStatus(ctx, client, gens.Index{Live: ix.Key, Group: group}, gens.DefaultGrace); err != nil {
			return fmt.Errorf("rolled back %s, but %w", indexes(len(idx)), err)
		}
	}
	if asJSON {
		out := indexesJSON(idx)
		for i := range out {
			out[i].Mode, out[i].Generations = gs[i].mode(), gs[i].json()
		}
		return writeJSON(c.stdout, rollbackJSON{Server: srv.json(), Keys: out})
	}
	fmt.Fprintf(c.stdout, "rolled back %s to the previous generation; 'keyswap rollback' again rolls forward\n\n", indexes(len(idx)))
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tCURRENT\tPREVIOUS\tLIVE SINCE")
	for i, ix := range idx {
		cur, prev := "-", "-"
		if g := gs[i]; g != nil && g.Current != 0 {
			cur = fmtInt(g.Current)
		}
		if g := gs[i]; g != nil && g.Previous != 0 {
			prev = fmtInt(g.Previous)
		}
		_, since, _, _ := ix.Generation.columns()
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", displayKey(ix.Key), cur, prev, since)
	}
	return tw.Flush()
}

// notClaimed returns an error matching keys.ErrGroupConflict, naming the
// group to pass, when the pointer without a group of one of lives holds
// the claim of a group other than group (any group's when group is empty)
// (SPEC C102): one GET each, pipelined, before anything takes a lock. In
// a group, lives are the indexes without the group's pointer: their keys
// in the rename-in-place shape are nobody's when another group claimed
// them.
func notClaimed(ctx context.Context, client rueidis.Client, group string, lives []string) error {
	if len(lives) == 0 {
		return nil
	}
	cluster := namesOf(client, "")
	cmds := make(rueidis.Commands, len(lives))
	for i, l := range lives {
		cmds[i] = client.B().Get().Key(keys.PointerKey(l, cluster)).Build()
	}
	for i, res := range client.DoMulti(ctx, cmds...) {
		v, err := res.ToString()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if isWrongType(err) {
			continue // not a claim: the rollback reports the pointer
		}
		if err != nil {
			return fmt.Errorf("GET %s: %w", displayKey(keys.PointerKey(lives[i], cluster)), err)
		}
		if g, ok := keys.ParseGroupMarker(v); ok && g != group {
			if group != "" {
				return fmt.Errorf("%w: index %s is in group %s, not %s; pass --group %s", keys.ErrGroupConflict, displayKey(lives[i]), displayKey(g), displayKey(group), displayKey(g))
			}
			return fmt.Errorf("%w: index %s is in group %s; pass --group %s", keys.ErrGroupConflict, displayKey(lives[i]), displayKey(g), displayKey(g))
		}
	}
	return nil
}

// aliasedAway returns, for each of lives, whether its base is another
// index's: on a cluster, the base of a live key that another live key can
// share (keys.Aliasable, X and "{X}") whose owner stamp names the other
// key (SPEC C104). Such an index is in the rename-in-place shape: the
// pointer in its base, and a group's claim there (SPEC C102), are the
// other index's. One GET per such key, pipelined, none for the others; a
// stamp of another type than a string, or naming neither live key of the
// base, is an error.
func aliasedAway(ctx context.Context, client rueidis.Client, lives []string) ([]bool, error) {
	cluster := namesOf(client, "")
	out := make([]bool, len(lives))
	var at []int
	var cmds rueidis.Commands
	for i, l := range lives {
		if keys.Aliasable(l, cluster.Cluster) {
			at = append(at, i)
			cmds = append(cmds, client.B().Get().Key(keys.OwnerKey(l, cluster)).Build())
		}
	}
	if len(cmds) == 0 {
		return out, nil
	}
	for j, res := range client.DoMulti(ctx, cmds...) {
		l := lives[at[j]]
		stamp := keys.OwnerKey(l, cluster)
		alias := keys.Alias(l, strings.TrimSuffix(stamp, keys.OwnerSuffix))
		v, err := res.ToString()
		switch {
		case rueidis.IsRedisNil(err):
		case isWrongType(err):
			return nil, errors.New(keys.OwnerTampered(displayKey(stamp), "key of another type than a string", displayKey(l)))
		case err != nil:
			return nil, fmt.Errorf("GET %s: %w", displayKey(stamp), err)
		case v != l && v != alias:
			return nil, errors.New(keys.OwnerStray(displayKey(stamp), v, displayKey(l), displayKey(alias)))
		default:
			out[at[j]] = v != l
		}
	}
	return out, nil
}

// ours returns the keys of lives whose base is their own (away, as
// aliasedAway returns it, is not set).
func ours(lives []string, away []bool) []string {
	var out []string
	for i, l := range lives {
		if !away[i] {
			out = append(out, l)
		}
	}
	return out
}

// hasPointers returns, for each of lives, whether it has a pointer: it is
// in Generations mode. The indexes are in group (none when empty).
func hasPointers(ctx context.Context, client rueidis.Client, group string, lives []string) ([]bool, error) {
	cluster := namesOf(client, group)
	ks := make([]string, len(lives))
	for i, l := range lives {
		ks[i] = keys.PointerKey(l, cluster)
	}
	found, err := existing(ctx, client, ks)
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(lives))
	for i, k := range ks {
		out[i] = found[k]
	}
	return out, nil
}

// indexes returns "1 index" or "n indexes".
func indexes(n int) string {
	if n == 1 {
		return "1 index"
	}
	return fmt.Sprintf("%d indexes", n)
}
