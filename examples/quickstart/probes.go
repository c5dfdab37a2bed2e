package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"text/tabwriter"

	"github.com/redis/rueidis"
)

// probe is one read a reader makes, chosen to show one change.
type probe struct {
	cmd  string // what a reader runs, for display
	why  string // what changed
	read func(ctx context.Context, c rueidis.Client) (string, error)
}

// probes returns reads that show what today's rebuild changes, for the
// table of n users.
func (ix indexes) probes(n int) []probe {
	hget := func(email, why string) probe {
		return probe{"HGET " + ix.byEmail + " " + email, why, func(ctx context.Context, c rueidis.Client) (string, error) {
			v, err := c.Do(ctx, c.B().Hget().Key(ix.byEmail).Field(email).Build()).ToString()
			if rueidis.IsRedisNil(err) {
				return "(nil)", nil
			}
			return v, err
		}}
	}
	sismember := func(cc, id, why string) probe {
		return probe{"SISMEMBER " + ix.byCountry + ":" + cc + " " + id, why, func(ctx context.Context, c rueidis.Client) (string, error) {
			in, err := c.Do(ctx, c.B().Sismember().Key(ix.byCountry+":"+cc).Member(id).Build()).AsBool()
			return strconv.FormatBool(in), err
		}}
	}
	fresh := n * 9 / 10 // the first new user with an unchanged, non-blank email
	for deleted(fresh) || fresh%11 == 0 || fresh%7 == 0 {
		fresh++
	}
	return []probe{
		hget("user9@old.example", "u00009 was deleted"),
		hget("user7@old.example", "u00007 changed email"),
		hget("user7@new.example", "... to this one"),
		sismember("de", "u00006", "u00006 moved from de"),
		sismember("fr", "u00006", "... to fr"),
		hget(fmt.Sprintf("user%d@old.example", fresh), "a new user"),
		{"EXISTS " + ix.byCountry + ":br", "nobody lives in br any more", func(ctx context.Context, c rueidis.Client) (string, error) {
			n, err := c.Do(ctx, c.B().Exists().Key(ix.byCountry+":br").Build()).AsInt64()
			return strconv.FormatInt(n, 10), err
		}},
	}
}

// view is what a reader sees at one moment.
type view struct {
	sizes  map[string]int64 // by key; -1 when absent
	probes []string         // by probe
}

// look reads a view.
func (ix indexes) look(ctx context.Context, c rueidis.Client, probes []probe) (view, error) {
	sizes, err := ix.counts(ctx, c, allCountries)
	if err != nil {
		return view{}, err
	}
	v := view{sizes: sizes}
	for _, p := range probes {
		got, err := p.read(ctx, c)
		if err != nil {
			return view{}, fmt.Errorf("%s: %w", p.cmd, err)
		}
		v.probes = append(v.probes, got)
	}
	return v, nil
}

// printViews prints two views side by side.
func printViews(w io.Writer, probes []probe, before, after view) {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  key\tbefore\tafter\t")
	size := func(n int64) string {
		if n < 0 {
			return "(absent)"
		}
		return strconv.FormatInt(n, 10)
	}
	for _, k := range slices.Sorted(maps.Keys(after.sizes)) {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t\n", k, size(before.sizes[k]), size(after.sizes[k]))
	}
	fmt.Fprintln(tw, "\t\t\t")
	fmt.Fprintln(tw, "  a reader runs\tbefore\tafter\t")
	for i, p := range probes {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t# %s\n", p.cmd, before.probes[i], after.probes[i], p.why)
	}
	tw.Flush()
}
