package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/store"
)

const sweepUsage = `Usage: keyswap sweep [flags]

Sweep finds the temp keys that crashed rebuilds left behind and, with
--delete, deletes them. Without --delete it is a dry run (--dry-run says so
explicitly): it prints what it would delete and changes nothing. Run it
without --delete first.

A key is deleted only if all of these hold, checked in this order:

  1. its name has a temp key's shape, <key>:rebuild:<unix>[:<16 hex>];
  2. no rebuild lock exists for its key, nor for a ':'-separated prefix of
     that key (a rebuild of a family of keys locks their common prefix);
  3. it has no TTL, so it would never expire by itself;
  4. the timestamp in its name is older than --older-than.

So a sweep never deletes a lock, a key with a TTL, a recent key, or the temp
key of a rebuild that holds its lock. It scans with SCAN, never KEYS, on
every master of a cluster, and deletes with UNLINK in chunks.

Sweep also removes the dead generations of the indexes published in
Generations mode (rebuild.Options.Publish = rebuild.Generations) whose temp
keys --pattern matches: those retired longer than --grace ago (10s by
default, as rebuild.Options.Grace: it must exceed the time readers cache
an index's pointer), and those a run built and abandoned (building:<token>
while the index's lock does not hold <token>). It never removes the
current or the previous generation, nor a build in progress. It finds the
indexes by their registries (<key>:rebuild-gens), in a second SCAN of the
keyspace, and removes each generation in small chunks (SCAN MATCH, UNLINK
of at most 256 keys per command), its registry field last, checking before
each chunk that the generation's state has not changed. A registry or
pointer that holds what no run writes stops the sweep of its index, which
keeps everything, and the sweep exits 1 after the other indexes.

On Redis Cluster the untagged key X and the key {X} (likewise a}b and
{rbN}a}b) have the same base, {X}, which names the registry, while the
data keys of a generation hang off the index's own key (X:rebuild-g:G,
{X}:rebuild-g:G). Every run in Generations mode stamps such a base with
its key (<base>:rebuild-owner), and the sweep takes the index from that
stamp. A base without a stamp (written before keyswap kept one, or by
RenameInPlace runs only), or with one of another type or naming neither
key, is not swept: the sweep says which base and both keys, and exits 1
after the other indexes. Run that index once in Generations mode, which
stamps its base, or, knowing which it is, SET <base>:rebuild-owner to its
key.

With --plain, it also deletes what an index that switched from
rename-in-place to Generations mode left in the plain shape: its live key,
or its family's buckets (<prefix>:<bucket>) of the type its meta records,
none of keyswap's own keys; only while the index's pointer exists, checked
in the same step as each deletion. Give it once every reader of those
indexes resolves the pointer (the package reader): a reader that does not
reads exactly those keys. A dry run counts a plain key, not a family's
buckets (that takes a scan).

It prints every key it deletes (or would delete), one per line, then a
summary line that names the server. When it found indexes in Generations
mode, it then prints each generation it removed (or would remove) and
each it kept with why, then a summary line. Keys that are not printable text are
Go-quoted. -json prints one object instead, with the names exact:

  {
    "server": {"mode": "standalone", "addrs": ["10.0.0.5:6379"], "db": 0},
    "dry_run": true,
    "pattern": "*:rebuild:*",
    "older_than_seconds": 3600,
    "keys": [
      {"key": "users:by-email:rebuild:1735830245:0123456789abcdef"},
      {"key_base64": "/3g6cmVidWlsZDoxNzM1ODMwMjQ1"}
    ],
    "count": 2,
    "grace_ms": 10000,
    "generations": [{                 the indexes in Generations mode
      "key": "users:by-email",        a family's prefix for a family; the base for
                                      one whose stamp names neither key (see above)
      "family": false,
      "removed": [{"gen": 1, "state": "retired:1735830245123", "keys": 1}],
                                      in a dry run, what it would remove;
                                      "keys": null for a family's, not counted
      "kept": [{"gen": 3, "state": "current", "reason": "current: readers read it"}],
      "plain": {"keys": 1, "note": ""},   --plain: the keys left in the plain shape
                                      (null: not counted); "note" says why none
                                      were looked for
      "error": "..."                  only when its sweep failed
    }],
    "generation_count": 1,            generations removed (or to remove)
    "generation_keys": 1,             their keys, as counted
    "error": "..."                    only when the sweep failed
  }

Redis names are bytes: a name that is valid UTF-8 is a JSON string, as
"key" above; any other name (one holding the byte 0xff, say) is given
instead as the standard base64 of its bytes, as "key_base64", and "key" is
left out. The same goes for "pattern" and "pattern_base64".

Exit status: without --delete, 0 when there is nothing to delete and 3 when
there is, temp keys or generations (for monitoring); with --delete, 0 once every key found is
deleted. 1 on an error (some keys may have been deleted before it: they
are listed), 2 on a usage error.

WARNING: do not sweep during a rolling upgrade from a version without the
rebuild lock. Such versions hold no lock and put no TTL on their temp keys,
so the sweep cannot tell their running rebuilds from abandoned ones: past
--older-than it deletes both, and the old code then swaps a missing temp
key as an empty rebuild and deletes the live index. Sweep once every
process runs a locking version and no older rebuild is left.`

// sweepJSON is the -json document of 'keyswap sweep' (see sweepUsage).
type sweepJSON struct {
	Server           serverJSON `json:"server"`
	DryRun           bool       `json:"dry_run"`
	Pattern          *string    `json:"pattern,omitempty"`
	PatternBase64    []byte     `json:"pattern_base64,omitempty"`
	OlderThanSeconds int64      `json:"older_than_seconds"`
	Keys             []jsonKey  `json:"keys"`
	Count            int        `json:"count"`
	// GraceMillis, Generations, GenerationCount and GenerationKeys are
	// the sweep of the indexes in Generations mode.
	GraceMillis     int64          `json:"grace_ms"`
	Generations     []genSweepJSON `json:"generations"`
	GenerationCount int            `json:"generation_count"`
	GenerationKeys  int64          `json:"generation_keys"`
	Error           string         `json:"error,omitempty"`
}

// sweepFlags are the flags of 'keyswap sweep'.
type sweepFlags struct {
	conn      *connFlags
	del       bool
	dryRun    bool
	pattern   string
	olderThan time.Duration
	legacy    bool
	asJSON    bool
	progress  string
	grace     time.Duration
	plain     bool
}

// sweep is the 'keyswap sweep' command.
func (c *cli) sweep(ctx context.Context, args []string) error {
	f, err := c.parseSweep(args)
	if err != nil {
		return err
	}
	client, err := c.connect(ctx, f.conn)
	if err != nil {
		return err
	}
	defer client.Close()

	dryRun := !f.del
	bar := c.newSweepProgress(ctx, client, f.progress, dryRun)
	swept, err := store.New(client, store.Options{Now: c.now}).Sweep(ctx, store.SweepOptions{
		Pattern:   f.pattern,
		OlderThan: f.olderThan,
		Legacy:    f.legacy,
		DryRun:    dryRun,
		Progress:  bar.update,
	})
	bar.finish()
	slices.Sort(swept)
	var genSwept []genSweep
	if err == nil {
		genSwept, err = sweepGenerations(ctx, client, f.pattern, f.grace, dryRun, f.plain)
	}
	srv := serverOf(client, f.conn.used)
	if jerr := c.reportSweep(f, srv, swept, genSwept, err); jerr != nil && err == nil {
		return jerr
	}
	if err == nil {
		err = genErrors(genSwept)
	}
	removable, _ := genCounts(genSwept)
	for _, s := range genSwept {
		if s.Plain != nil && (s.Plain.Keys == nil || *s.Plain.Keys > 0) && s.Plain.Note == "" {
			removable++
		}
	}
	reported := func(err error) error { // -json has printed err in its document
		if f.asJSON {
			return fmt.Errorf("%w (%w)", err, errReported)
		}
		return err
	}
	switch {
	case err != nil && !dryRun:
		// err is a *store.Error, which names the operation ("keyswap:
		// sweep: ..."): no prefix of ours.
		return reported(fmt.Errorf("%w (deleted %s before the error)", err, plural(len(swept), "key")))
	case err != nil:
		return reported(err)
	case dryRun && len(swept)+removable > 0:
		return errOrphansFound
	}
	return nil
}

// parseSweep parses the arguments of 'keyswap sweep'.
func (c *cli) parseSweep(args []string) (sweepFlags, error) {
	fs := newFlagSet("sweep")
	f := sweepFlags{conn: addConnFlags(fs)}
	fs.BoolVar(&f.del, "delete", false, "delete the keys; without it, sweep is a dry run that deletes nothing")
	fs.BoolVar(&f.dryRun, "dry-run", false, "delete nothing: print what --delete would delete (the default, said explicitly)")
	fs.StringVar(&f.pattern, "pattern", store.DefaultSweepPattern,
		"SCAN MATCH `glob` of the temp keys to consider; each match is still checked against the\n"+
			"temp-key shape. Keep a leading * on a cluster, where temp keys may start with a hash tag ({key}:rebuild:...).")
	fs.DurationVar(&f.olderThan, "older-than", store.DefaultSweepOlderThan,
		"minimum `age` of a temp key to delete, judged by the timestamp in its name")
	fs.BoolVar(&f.legacy, "legacy", false, "also sweep keys of the legacy shape <key>:rebuild:<digits>, without a nonce, which\n"+
		"Familia made and keyswap does not; application keys can have that shape (ci:rebuild:12345), so only after an upgrade from Familia")
	fs.DurationVar(&f.grace, "grace", gens.DefaultGrace,
		"how long after its retirement a retired generation of an index in Generations mode is kept: longer than\n"+
			"the readers' cache of the pointer, as rebuild.Options.Grace")
	fs.BoolVar(&f.plain, "plain", false, "also delete the keys that indexes switched from rename-in-place to Generations mode left in\n"+
		"the plain shape (their live key, a family's buckets), once every reader resolves the pointer")
	fs.BoolVar(&f.asJSON, "json", false, "print one JSON object (described above) instead of lines")
	fs.StringVar(&f.progress, "progress", progressAuto,
		"`mode` of the progress display on stderr: auto (when stderr is a terminal and the keyspace holds at least\n"+
			fmt.Sprint(progressMinKeys)+" keys), always, or never")
	positional, err := c.parse(fs, args, sweepUsage)
	switch {
	case err != nil:
		return f, err
	case len(positional) > 0:
		return f, usagef("unexpected arguments %q (did you mean --pattern?)", positional)
	case f.del && f.dryRun:
		return f, usagef("--delete and --dry-run contradict each other: give one")
	case f.olderThan <= 0:
		return f, usagef("--older-than %v: must be positive", f.olderThan)
	case f.pattern == "":
		return f, usagef("--pattern must not be empty")
	case f.grace <= 0:
		return f, usagef("--grace %v: must be positive", f.grace)
	}
	switch f.progress {
	case progressAuto, progressAlways, progressNever:
		return f, nil
	}
	return f, usagef("--progress %q: want auto, always or never", f.progress)
}

// reportSweep prints the result of a sweep with flags f on srv, as lines
// or as JSON: the keys swept, the generations swept, and err, the sweep's
// error.
func (c *cli) reportSweep(f sweepFlags, srv server, swept []string, genSwept []genSweep, err error) error {
	if !f.asJSON {
		c.printSwept(srv, swept, !f.del, err)
		c.printGenSwept(genSwept, !f.del)
		return nil
	}
	rep := sweepJSON{Server: srv.json(), DryRun: !f.del, OlderThanSeconds: int64(f.olderThan / time.Second), Keys: jsonKeys(swept), Count: len(swept),
		GraceMillis: f.grace.Milliseconds(), Generations: make([]genSweepJSON, 0, len(genSwept))}
	rep.Pattern, rep.PatternBase64 = jsonName(f.pattern)
	for _, s := range genSwept {
		rep.Generations = append(rep.Generations, s.json())
	}
	rep.GenerationCount, rep.GenerationKeys = genCounts(genSwept)
	if err == nil {
		err = genErrors(genSwept)
	}
	if err != nil {
		rep.Error = err.Error()
	}
	return writeJSON(c.stdout, rep)
}

// genErrors returns the errors of the indexes whose generations were not
// swept, joined; nil when there is none.
func genErrors(ss []genSweep) error {
	var errs []error
	for _, s := range ss {
		if s.Err != nil {
			errs = append(errs, fmt.Errorf("generations of %s: %w", s.name(), s.Err))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("sweep: %w", errors.Join(errs...))
}

// printGenSwept prints the generations a sweep removed (or, in a dry run,
// would remove) and those it kept, one per line, then a summary line,
// when it found an index in Generations mode.
func (c *cli) printGenSwept(ss []genSweep, dryRun bool) {
	if len(ss) == 0 {
		return
	}
	verb := "removed"
	if dryRun {
		verb = "would remove"
	}
	swept := 0
	for _, s := range ss {
		for _, r := range s.Removed {
			keys := ""
			if r.Keys != nil {
				keys = ", " + plural(int(*r.Keys), "key")
			}
			fmt.Fprintf(c.stdout, "%s generation %d of %s (%s%s)\n", verb, r.Gen, s.name(), displayKey(r.State), keys)
		}
		for _, k := range s.Kept {
			fmt.Fprintf(c.stdout, "kept generation %d of %s (%s): %s\n", k.Gen, s.name(), displayKey(k.State), k.Reason)
		}
		if p := s.Plain; p != nil {
			switch {
			case p.Note != "":
				fmt.Fprintf(c.stdout, "kept the plain keys of %s: %s\n", s.name(), p.Note)
			case p.Keys == nil:
				fmt.Fprintf(c.stdout, "%s the plain buckets left of %s (not counted)\n", verb, s.name())
			default:
				fmt.Fprintf(c.stdout, "%s %s left of %s in the plain shape\n", verb, plural(int(*p.Keys), "key"), s.name())
			}
		}
		if s.Err == nil {
			swept++
		}
	}
	n, keys := genCounts(ss)
	if dryRun {
		fmt.Fprintf(c.stdout, "would remove %s of %s in Generations mode (dry run; pass --delete to remove)\n", plural(n, "generation"), indexes(swept))
		return
	}
	fmt.Fprintf(c.stdout, "removed %s (%s) of %s in Generations mode\n", plural(n, "generation"), plural(int(keys), "key"), indexes(swept))
}

// printSwept prints the keys a sweep of srv deleted (or, in a dry run,
// would delete), then a summary line unless a dry run failed.
func (c *cli) printSwept(srv server, swept []string, dryRun bool, err error) {
	for _, k := range swept {
		fmt.Fprintln(c.stdout, displayKey(k))
	}
	switch {
	case dryRun && err == nil:
		fmt.Fprintf(c.stdout, "would delete %s of %s (dry run; pass --delete to delete)\n", plural(len(swept), "key"), srv)
	case !dryRun:
		fmt.Fprintf(c.stdout, "deleted %s of %s\n", plural(len(swept), "key"), srv)
	}
}
