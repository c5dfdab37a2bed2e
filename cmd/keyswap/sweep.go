package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/keyswap/keyswap/store"
)

const sweepUsage = `Usage: keyswap sweep [flags]

Sweep finds the temp keys that crashed rebuilds left behind and, with
--delete, deletes them. Without --delete it is a dry run: it prints what it
would delete and changes nothing. Run it without --delete first.

A key is deleted only if all of these hold, checked in this order:

  1. its name has a temp key's shape, <key>:rebuild:<unix>[:<16 hex>];
  2. no rebuild lock exists for its key, nor for a ':'-separated prefix of
     that key (a rebuild of a family of keys locks their common prefix);
  3. it has no TTL, so it would never expire by itself;
  4. the timestamp in its name is older than --older-than.

So a sweep never deletes a lock, a key with a TTL, a recent key, or the temp
key of a rebuild that holds its lock. It scans with SCAN, never KEYS, on
every master of a cluster, and deletes with UNLINK in chunks.

It prints every key it deletes (or would delete), one per line, then a
summary line. Keys that are not printable text are Go-quoted; -json prints
them exactly, as {"dry_run": bool, "pattern": string, "older_than_seconds":
int, "keys": [string], "count": int, "error": string (only on failure)}.

Exit status: without --delete, 0 when there is nothing to delete and 3 when
there is (for monitoring); with --delete, 0 once every key found is
deleted. 1 on an error (some keys may have been deleted before it: they
are listed), 2 on a usage error.

WARNING: do not sweep during a rolling upgrade from a version without the
rebuild lock. Such versions hold no lock and put no TTL on their temp keys,
so the sweep cannot tell their running rebuilds from abandoned ones: past
--older-than it deletes both, and the old code then swaps a missing temp
key as an empty rebuild and deletes the live index. Sweep once every
process runs a locking version and no older rebuild is left.`

// sweepReport is the -json document of 'keyswap sweep'.
type sweepReport struct {
	DryRun           bool     `json:"dry_run"`
	Pattern          string   `json:"pattern"`
	OlderThanSeconds int64    `json:"older_than_seconds"`
	Keys             []string `json:"keys"`
	Count            int      `json:"count"`
	Error            string   `json:"error,omitempty"`
}

// sweep is the 'keyswap sweep' command.
func (c *cli) sweep(ctx context.Context, args []string) error {
	fs := newFlagSet("sweep")
	conn := addConnFlags(fs)
	del := fs.Bool("delete", false, "delete the keys; without it, sweep is a dry run that deletes nothing")
	pattern := fs.String("pattern", store.DefaultSweepPattern,
		"SCAN MATCH `glob` of the temp keys to consider; each match is still checked against the\n"+
			"temp-key shape. Keep a leading * on a cluster, where temp keys may start with a hash tag ({key}:rebuild:...).")
	olderThan := fs.Duration("older-than", store.DefaultSweepOlderThan,
		"minimum `age` of a temp key to delete, judged by the timestamp in its name")
	asJSON := fs.Bool("json", false, "print one JSON object (described above) instead of lines")
	progress := fs.String("progress", progressAuto,
		"`mode` of the progress display on stderr: auto (when stderr is a terminal and the keyspace holds at least\n"+
			fmt.Sprint(progressMinKeys)+" keys), always, or never")
	positional, err := c.parse(fs, args, sweepUsage)
	if err != nil {
		return err
	}
	if len(positional) > 0 {
		return usagef("unexpected arguments %q (did you mean --pattern?)", positional)
	}
	if *olderThan <= 0 {
		return usagef("--older-than %v: must be positive", *olderThan)
	}
	if *pattern == "" {
		return usagef("--pattern must not be empty")
	}
	switch *progress {
	case progressAuto, progressAlways, progressNever:
	default:
		return usagef("--progress %q: want auto, always or never", *progress)
	}

	client, err := c.connect(ctx, conn)
	if err != nil {
		return err
	}
	defer client.Close()

	dryRun := !*del
	bar := c.newSweepProgress(ctx, client, *progress, dryRun)
	swept, err := store.New(client, store.Options{Now: c.now}).Sweep(ctx, store.SweepOptions{
		Pattern:   *pattern,
		OlderThan: *olderThan,
		DryRun:    dryRun,
		Progress:  bar.update,
	})
	bar.finish()
	slices.Sort(swept)

	if *asJSON {
		rep := sweepReport{DryRun: dryRun, Pattern: *pattern, OlderThanSeconds: int64(*olderThan / time.Second),
			Keys: swept, Count: len(swept)}
		if rep.Keys == nil {
			rep.Keys = []string{}
		}
		if err != nil {
			rep.Error = err.Error()
		}
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(rep); jerr != nil && err == nil {
			return jerr
		}
	} else {
		for _, k := range swept {
			fmt.Fprintln(c.stdout, displayKey(k))
		}
		switch {
		case dryRun && err == nil:
			fmt.Fprintf(c.stdout, "would delete %s (dry run; pass --delete to delete)\n", plural(len(swept), "key"))
		case !dryRun:
			fmt.Fprintf(c.stdout, "deleted %s\n", plural(len(swept), "key"))
		}
	}
	if err != nil {
		// err is a *store.Error, which names the operation ("keyswap:
		// sweep: ..."): no prefix of ours.
		if !dryRun {
			return fmt.Errorf("%w (deleted %s before the error)", err, plural(len(swept), "key"))
		}
		return err
	}
	if dryRun && len(swept) > 0 {
		return errOrphansFound
	}
	return nil
}
