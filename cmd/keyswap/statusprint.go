package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"time"
)

// writeStatus prints rep as tables, then a summary line.
func writeStatus(w io.Writer, rep *statusReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(rep.Locks) == 0 {
		fmt.Fprintln(tw, "No rebuild in progress.")
	} else {
		fmt.Fprintln(tw, "REBUILDS IN PROGRESS")
		fmt.Fprintln(tw, "LOCK\tTTL\tTOKEN")
		for _, l := range rep.Locks {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", displayKey(l.Key), fmtTTL(l.TTLSeconds), displayKey(l.TokenPrefix))
		}
	}
	if err := tw.Flush(); err != nil {
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

	olderThan := time.Duration(rep.OlderThanSeconds) * time.Second
	fmt.Fprintf(w, "\n%s in progress; %s, %d without a TTL; %s (no TTL, no lock, older than %s).\n",
		plural(len(rep.Locks), "rebuild"), plural(len(rep.TempKeys), "temp key"), unexpiring,
		plural(rep.candidates(), "sweep candidate"), olderThan)
	if cmds := rep.sweepCommands(); len(cmds) > 0 {
		fmt.Fprintln(w, "List them with the following, and add --delete to delete them:")
		for _, cmd := range cmds {
			fmt.Fprintf(w, "  %s\n", cmd)
		}
	}
	return nil
}

// sweepCommands returns the sweep commands that list rep's sweep
// candidates: one per --pattern needed to cover them, limited to the temp
// keys of the live keys that rep's pattern selects (see sweepPattern).
// Most often that is one command; on a cluster, the candidates of live keys
// that keyswap wraps in a hash tag and of live keys that carry their own
// need one each.
func (rep *statusReport) sweepCommands() []string {
	olderThan := time.Duration(rep.OlderThanSeconds) * time.Second
	cmds := map[string]bool{}
	for _, t := range rep.TempKeys {
		if !t.SweepCandidate {
			continue
		}
		cmd := "keyswap sweep --older-than " + olderThan.String()
		if rep.Pattern != "" && rep.Pattern != "*" {
			p, ok := sweepPattern(rep.Pattern, t.Base, rep.Cluster)
			if !ok {
				continue // not selected by the pattern: never listed
			}
			cmd += " --pattern " + shellQuote(p)
		}
		cmds[cmd] = true
	}
	return slices.Sorted(maps.Keys(cmds))
}
