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
	lives, err := c.parse(fs, args, rollbackUsage)
	if err != nil {
		return err
	}
	if len(lives) == 0 {
		return usagef("want at least one key")
	}
	client, err := c.connect(ctx, conn)
	if err != nil {
		return err
	}
	defer client.Close()

	what := strings.Join(lives, ", ")
	before, err := readGenerations(ctx, client, lives)
	if err != nil {
		return fmt.Errorf("rollback %s: %w", what, err)
	}
	pointers, err := hasPointers(ctx, client, lives)
	if err != nil {
		return fmt.Errorf("rollback %s: %w", what, err)
	}
	if slices.Contains(pointers, true) {
		return c.genRollback(ctx, client, conn, lives, before, pointers, *asJSON)
	}
	families := make([]string, len(lives))
	for i, g := range before {
		if g == nil {
			return fmt.Errorf("rollback %s: %w: keyswap never published it (it has no meta, %s); nothing changed",
				displayKey(lives[i]), krun.ErrNothingToRollBack, displayKey(metaKey(client, lives[i])))
		}
		families[i] = g.FamilyType // "" for a plain key
	}
	_, err = krun.New(client, nil).Rollback(ctx, krun.RollbackOptions{
		Op: "rollback", Key: what, Lives: lives, FamilyTypes: families, TTL: rollbackLease, Now: c.now(),
		MaxKeys: krun.DefaultMaxKeys,
	})
	if errors.Is(err, krun.ErrInProgress) {
		return fmt.Errorf("%w; nothing changed: roll back once it has ended, or end it ('keyswap cancel', 'keyswap discard')", err)
	}
	if err != nil {
		return err
	}
	after, err := readGenerations(ctx, client, lives)
	if err != nil {
		return fmt.Errorf("rolled back %s, but reading the generations failed: %w", what, err)
	}
	idx := make([]keyGeneration, len(lives))
	for i, l := range lives {
		idx[i] = keyGeneration{Key: l, Family: families[i] != "", Generation: after[i]}
	}
	if *asJSON {
		return writeJSON(c.stdout, rollbackJSON{Server: serverOf(client, conn.used).json(), Keys: indexesJSON(idx)})
	}
	fmt.Fprintf(c.stdout, "rolled back %s; 'keyswap rollback' again rolls forward while PREV is kept\n\n", indexes(len(lives)))
	return writeGenerations(c, idx)
}

// genRollback rolls back lives, indexes in Generations mode (each has a
// pointer, as pointers says), whose metas are before: a flip of each
// pointer back to the previous generation, in one script fenced by the
// indexes' locks (krun.Redis.GenRollback).
func (c *cli) genRollback(ctx context.Context, client rueidis.Client, conn *connFlags, lives []string, before []*generation, pointers []bool, asJSON bool) error {
	what := strings.Join(lives, ", ")
	var plain []string
	for i, l := range lives {
		if !pointers[i] {
			plain = append(plain, displayKey(l))
		}
	}
	if len(plain) > 0 {
		return fmt.Errorf("rollback %s: %s in the rename-in-place shape (no pointer, %s) and the others in Generations mode: one rollback flips indexes of one mode; roll them back separately; nothing changed",
			what, strings.Join(plain, ", "), displayKey(keys.PointerKey(lives[slices.Index(pointers, false)], client.Mode() == rueidis.ClientModeCluster)))
	}
	families := make([]string, len(lives))
	for i, g := range before {
		if g != nil {
			families[i] = g.FamilyType
		}
	}
	_, err := krun.New(client, nil).GenRollback(ctx, krun.RollbackOptions{
		Op: "rollback", Key: what, Lives: lives, FamilyTypes: families, TTL: rollbackLease, Now: c.now(),
	})
	if errors.Is(err, krun.ErrInProgress) {
		return fmt.Errorf("%w; nothing changed: roll back once it has ended, or end it ('keyswap cancel', 'keyswap discard')", err)
	}
	if err != nil {
		return err
	}
	after, err := readGenerations(ctx, client, lives)
	if err != nil {
		return fmt.Errorf("rolled back %s, but reading the generations failed: %w", what, err)
	}
	idx := make([]keyGeneration, len(lives))
	gs := make([]*genStatus, len(lives))
	for i, l := range lives {
		idx[i] = keyGeneration{Key: l, Family: families[i] != "", Generation: after[i]}
		if gs[i], err = readGenStatus(ctx, client, l, gens.DefaultGrace); err != nil {
			return fmt.Errorf("rolled back %s, but %w", what, err)
		}
	}
	if asJSON {
		out := indexesJSON(idx)
		for i := range out {
			out[i].Mode, out[i].Generations = gs[i].mode(), gs[i].json()
		}
		return writeJSON(c.stdout, rollbackJSON{Server: serverOf(client, conn.used).json(), Keys: out})
	}
	fmt.Fprintf(c.stdout, "rolled back %s to the previous generation; 'keyswap rollback' again rolls forward\n\n", indexes(len(lives)))
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tCURRENT\tPREVIOUS\tLIVE SINCE")
	for i, l := range lives {
		cur, prev := "-", "-"
		if g := gs[i]; g != nil && g.Current != 0 {
			cur = fmtInt(g.Current)
		}
		if g := gs[i]; g != nil && g.Previous != 0 {
			prev = fmtInt(g.Previous)
		}
		_, since, _, _ := after[i].columns()
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", displayKey(l), cur, prev, since)
	}
	return tw.Flush()
}

// hasPointers returns, for each of lives, whether it has a pointer: it is
// in Generations mode.
func hasPointers(ctx context.Context, client rueidis.Client, lives []string) ([]bool, error) {
	cluster := client.Mode() == rueidis.ClientModeCluster
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

// metaKey returns the key of live's meta on client's deployment.
func metaKey(client rueidis.Client, live string) string {
	return keys.MetaKey(live, client.Mode() == rueidis.ClientModeCluster)
}

// indexes returns "1 index" or "n indexes".
func indexes(n int) string {
	if n == 1 {
		return "1 index"
	}
	return fmt.Sprintf("%d indexes", n)
}
