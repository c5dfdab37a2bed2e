package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/keyswap/keyswap/internal/gens"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/scan"
)

// writeStatus prints rep as tables, then a summary line.
func writeStatus(w io.Writer, rep *statusReport) error {
	if len(rep.Server.Addrs) > 0 {
		fmt.Fprintf(w, "%s\n\n", rep.Server)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	switch {
	case len(rep.Locks) == 0 && rep.ByKey:
		fmt.Fprintf(tw, "No rebuild of %s in progress.\n", displayKey(rep.Key))
	case len(rep.Locks) == 0:
		fmt.Fprintln(tw, "No rebuild in progress.")
	default:
		fmt.Fprintln(tw, "REBUILDS IN PROGRESS")
		fmt.Fprintln(tw, "LOCK\tTTL\tTOKEN")
		for _, l := range rep.Locks {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", displayKey(l.Key), fmtTTL(l.TTLSeconds), displayKey(l.TokenPrefix))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.Runs) > 0 {
		if err := writeRuns(w, rep.Runs, rep.Time); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	if err := writeIndexes(w, rep.Indexes); err != nil {
		return err
	}
	if err := writeGenTable(w, rep.Indexes, rep.Time); err != nil {
		return err
	}
	fmt.Fprintln(tw)

	unexpiring := 0
	if len(rep.TempKeys) == 0 {
		fmt.Fprintln(tw, "No temp keys.")
	} else {
		fmt.Fprintln(tw, "TEMP KEYS")
		fmt.Fprintln(tw, "KEY\tAGE\tTTL\tTYPE\tSIZE\tMEMORY\tLOCKED\tSWEEP")
		for _, t := range rep.TempKeys {
			if t.TTLSeconds == -1 {
				unexpiring++
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", displayKey(t.Key), fmtAge(t.AgeSeconds),
				fmtTTL(t.TTLSeconds), t.Type, fmtOptional(t.Size, fmtInt), fmtOptional(t.MemoryBytes, fmtBytes),
				yesNo(t.Locked), yesNo(t.SweepCandidate))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if rep.ByKey {
		held := 0
		if rep.held()[keys.LockKey(rep.Key, rep.Cluster)] {
			held = 1
		}
		fmt.Fprintf(w, "\n%s in progress for %s; %s; read without a scan, so orphaned temp keys are not looked for: %s finds them.\n",
			plural(held, "rebuild"), displayKey(rep.Key), plural(len(rep.TempKeys), "temp key"), scanSuggestion(rep.Key, rep.SweepArgs))
		rep.writeGenSummary(w)
		rep.writeSweepCommands(w)
		return nil
	}
	olderThan := time.Duration(rep.OlderThanSeconds) * time.Second
	fmt.Fprintf(w, "\n%s in progress; %s, %d without a TTL; %s (no TTL, no lock, older than %s).\n",
		plural(len(rep.Locks), "rebuild"), plural(len(rep.TempKeys), "temp key"), unexpiring,
		plural(rep.tempCandidates(), "sweep candidate"), olderThan)
	rep.writeGenSummary(w)
	rep.writeSweepCommands(w)
	return nil
}

// writeSweepCommands prints the sweep commands that list rep's sweep
// candidates, if any.
func (rep *statusReport) writeSweepCommands(w io.Writer) {
	if cmds := rep.sweepCommands(); len(cmds) > 0 {
		fmt.Fprintln(w, "List them with the following, and add --delete to delete them:")
		for _, cmd := range cmds {
			fmt.Fprintf(w, "  %s\n", cmd)
		}
	}
}

// sweepCommands returns the sweep commands that list rep's sweep
// candidates: one per --pattern needed to cover them, limited to the temp
// keys of the live keys that rep's pattern selects (see sweepPattern).
// Most often that is one command; on a cluster, the candidates of live keys
// that keyswap wraps in a hash tag and of live keys that carry their own
// need one each. Each ends with rep.SweepArgs, the connection flags.
func (rep *statusReport) sweepCommands() []string {
	olderThan := time.Duration(rep.OlderThanSeconds) * time.Second
	pattern := rep.Pattern
	if rep.ByKey {
		pattern = scan.EscapeGlob(rep.Key)
	}
	cmds := map[string]bool{}
	add := func(base string) {
		cmd := "keyswap sweep --older-than " + olderThan.String()
		if rep.Grace != gens.DefaultGrace && rep.genCandidates() > 0 {
			cmd += " --grace " + rep.Grace.String()
		}
		if pattern != "" && pattern != "*" {
			p, ok := sweepPattern(pattern, base, rep.Cluster)
			if !ok {
				return // not selected by the pattern: never listed
			}
			cmd += " --pattern " + shellQuote(p)
		}
		if len(rep.SweepArgs) > 0 {
			cmd += " " + strings.Join(rep.SweepArgs, " ")
		}
		cmds[cmd] = true
	}
	for _, t := range rep.TempKeys {
		if t.SweepCandidate {
			add(t.Base)
		}
	}
	for _, ix := range rep.Indexes {
		if ix.Gens.candidates() > 0 {
			add(keys.Base(ix.Key, keys.Names{Cluster: rep.Cluster, Group: ix.Group}))
		}
	}
	return slices.Sorted(maps.Keys(cmds))
}

// writeGenSummary prints, when rep has indexes in Generations mode (or
// with a registry), how many of their generations a sweep would remove.
func (rep *statusReport) writeGenSummary(w io.Writer) {
	if !slices.ContainsFunc(rep.Indexes, func(ix indexStatus) bool { return ix.Gens != nil }) {
		return
	}
	fmt.Fprintf(w, "%s to remove (retired more than %s ago, or abandoned by their run).\n",
		plural(rep.genCandidates(), "generation"), rep.Grace)
}

// writeGenTable prints the indexes that have a registry or a pointer of
// Generations mode, as seen at now: their mode, generations current and
// previous, retired ones waiting for their removal (since when, and
// whether a sweep removes them), the builds in progress and abandoned,
// and a note for an index switching between modes or whose registry is
// corrupt. It prints nothing when there is none.
func writeGenTable(w io.Writer, idx []indexStatus, now time.Time) error {
	if !slices.ContainsFunc(idx, func(ix indexStatus) bool { return ix.Gens != nil }) {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nGENERATIONS")
	fmt.Fprintln(tw, "INDEX\tMODE\tCURRENT\tPREVIOUS\tRETIRED\tBUILDING\tNOTE")
	for _, ix := range idx {
		if ix.Gens == nil {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\n", ix.name(), strings.Join(ix.Gens.columns(now), "\t"))
	}
	return tw.Flush()
}

// writeRuns prints the runs in progress, then their keys' generations, as
// seen at now.
func writeRuns(w io.Writer, runs []runStatus, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nRUNS")
	fmt.Fprintln(tw, "LOCK\tPHASE\tOWNER\tAGE\tITEMS\tENTRIES\tRATE\tAVG\tLIMIT\tETA\tBEAT\tPROGRESS\tCHANGES\tREQUESTS")
	for _, r := range runs {
		eta := "-"
		if r.ETASeconds != nil {
			eta = fmtDuration(time.Duration(*r.ETASeconds) * time.Second)
		}
		rateNow := "-"
		if r.RateNow != nil {
			rateNow = fmtRate(*r.RateNow)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s:%d\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\n",
			displayKey(r.Lock), displayPhase(r.Phase), displayKey(phaseOr(r.Host, "-")), r.PID,
			fmtSince(r.Started, now), r.Items, r.Entries, rateNow, fmtRate(r.Rate), fmtLimit(r.Limit), eta,
			fmtSince(r.BeatAt, now), fmtSince(r.ProgressAt, now), r.Changes, r.Replayed, r.Requests.String())
	}
	fmt.Fprintln(tw, "\nKEYS OF THE RUNS")
	fmt.Fprintln(tw, "KEY\tLOCK\tFAMILY\tGEN\tLIVE SINCE\tPREV\tPREV KEPT UNTIL")
	for _, r := range runs {
		for _, g := range r.Generations {
			gen, since, prev, until := g.Generation.columns()
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", displayKey(g.Key), displayKey(r.Lock), yesNo(g.Family), gen, since, prev, until)
		}
	}
	return tw.Flush()
}

// writeIndexes prints the indexes, their generations and whether a
// rollback is possible now.
func writeIndexes(w io.Writer, idx []indexStatus) error {
	if len(idx) == 0 {
		_, err := fmt.Fprintln(w, "No index published.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEXES")
	fmt.Fprintln(tw, "INDEX\tFAMILY\tGEN\tLIVE SINCE\tPREV\tPREV KEPT UNTIL\tROLLBACK")
	for _, ix := range idx {
		family := "-"
		if ix.Generation != nil {
			family = yesNo(ix.Generation.Family)
		}
		gen, since, prev, until := ix.Generation.columns()
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ix.name(), family, gen, since, prev, until, ix.Rollback)
	}
	return tw.Flush()
}

// columns returns g's columns in tables: its generation, since when it is
// live, the generation kept for a rollback and until when; "-" for what
// is unknown or absent.
func (g *generation) columns() (gen, since, prev, until string) {
	if g == nil {
		return "-", "-", "-", "-"
	}
	gen, since, prev, until = fmtInt(g.Gen), fmtTime(g.At), "-", "-"
	if g.Prev != nil {
		prev, until = fmtInt(*g.Prev), fmtTime(g.PrevUntil)
	}
	return gen, since, prev, until
}

// String formats the requests in a table cell: "-" for none, else a
// comma-separated list such as "paused,max_rate=100".
func (q runRequests) String() string {
	var out []string
	if q.Cancel {
		out = append(out, "cancel")
	}
	if q.Paused {
		out = append(out, "paused")
	}
	if q.MaxRate > 0 {
		out = append(out, "max_rate="+strconv.FormatFloat(q.MaxRate, 'f', -1, 64))
	}
	if q.Action != "" {
		out = append(out, "action="+displayKey(q.Action))
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ",")
}

// fmtSince formats the time from t to now ("3s"), "-" for an unknown t.
func fmtSince(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmtAge(int64(now.Sub(t) / time.Second))
}

// fmtTime formats t in UTC to the second, "-" for an unknown t.
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// fmtRate formats a rate of items per second: "600.5/s".
func fmtRate(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) + "/s" }

// fmtLimit formats a run's limit: "none" for 0.
func fmtLimit(f float64) string {
	if f <= 0 {
		return "none"
	}
	return fmtRate(f)
}

// displayPhase formats a run's phase: as is for the phases a run writes
// ("catching up" included, which displayKey would quote), "-" for none.
func displayPhase(phase string) string {
	switch phase {
	case "":
		return "-"
	case "building", "catching up", "held", "waiting for durability", "publishing", "rolling back":
		return phase
	}
	if strings.HasPrefix(phase, unknownVersion) {
		return phase
	}
	return displayKey(phase)
}
