package main

import (
	"bytes"
	"fmt"
	"strings"
	"time"
)

// commandCell formats a summarized longest call: its median over rounds,
// and the maximum with its command's name; "—" when no command of the
// rounds reached the slowlog threshold.
func commandCell(ct commandTime, threshold time.Duration) string {
	if ct.Command == "" {
		return fmt.Sprintf("— (none ≥ %s)", dur(threshold))
	}
	return fmt.Sprintf("%s (max %s, %s)", dur(ct.Longest), dur(ct.Max), ct.Command)
}

// ratioCell formats a median ratio and its range, or "—" for none.
func ratioCell(med, lo, hi float64) string {
	if med == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f× (%.2f–%.2f)", med, lo, hi)
}

// summaryLine is the generations section's line of the report's summary.
func (g *generationsResult) summaryLine() string {
	var parts []string
	for _, sz := range g.Sizes {
		part := fmt.Sprintf("%s buckets: flip **%s**", commas(sz.Buckets), dur(sz.Generations.Summary.Publish))
		if sz.Ratio != 0 {
			part += fmt.Sprintf(", rename publish %s (**%.0f×**)", dur(sz.Rename.Summary.Publish), sz.Ratio)
		} else if est, from := renameEstimate(g.Sizes, sz.Buckets); len(sz.Rename.Runs) == 0 && from > 0 {
			part += fmt.Sprintf(", rename publish not run (≈ %s extrapolated)", dur(est))
		}
		parts = append(parts, part)
	}
	line := "Generations mode against rename-in-place, the publish's server time: " + strings.Join(parts, "; ") + "."
	if n := len(g.Sizes); n > 0 && len(g.Sizes[n-1].Generations.Runs) > 0 {
		sz := g.Sizes[n-1]
		s := sz.Generations.Summary
		line += fmt.Sprintf(" The longest command of a Generations run of %s buckets (median over rounds): %s, %s; of keyswap's own commands, %s, %s",
			commas(sz.Buckets), dur(s.Longest.Longest), s.Longest.Command, dur(s.Own.Longest), s.Own.Command)
		if len(sz.Raw.Runs) > 0 {
			line += fmt.Sprintf("; raw writing the same data, %s, %s", dur(sz.Raw.Summary.Longest.Longest), sz.Raw.Summary.Longest.Command)
		}
		line += "."
	}
	if c := g.CPU; c != nil {
		if gm, rn := c.method(string(modeGenerations)), c.method(string(modeRename)); gm != nil && rn != nil {
			line += fmt.Sprintf(" Server CPU per entry at %s buckets: generations %s, rename %s",
				commas(c.Buckets), perItem(gm.Series.Summary.ServerCPU, c.Items), perItem(rn.Series.Summary.ServerCPU, c.Items))
			if gm.ServerRatio != 0 {
				line += fmt.Sprintf(" (%.2f× and %.2f× the limit's)", gm.ServerRatio, rn.ServerRatio)
			}
			line += "."
		}
	}
	if c := g.Cluster; c != nil && len(c.Runs) > 0 && c.Runs[0].Series.Summary.Speedup != 0 {
		s := c.Runs[0].Series.Summary
		line += fmt.Sprintf(" On a %d-master cluster, a family spread over the masters: %s items/s, %.2f× the same family on one master.", c.Masters, rate(s.Rate), s.Speedup)
	}
	return line
}

// markdown writes the generations section; cpus is the machine's.
func (g *generationsResult) markdown(b *bytes.Buffer, cpus int) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("## Generations\n\n")
	p("The same SetIndex families rebuilt in each publishing mode onto a live family published in that mode, a tenth of whose buckets the new data no longer has: ")
	p("**rename** (`rebuild.RenameInPlace`, `MaxKeys` -1) renames every bucket's temp key over its live key and deletes the orphans in one script; ")
	p("**generations** (`rebuild.Generations`, `Grace` %s) writes a new generation and flips a pointer to it, then removes the previous generation in chunks once the grace period is over. ", g.Grace)
	p("%d rounds, the modes and sizes interleaved. Server times are SLOWLOG's, which logs the commands of %s or more; a publish shorter than that is timed by INFO commandstats, alone. ", g.Rounds, dur(g.Threshold))
	p("After every run the bench waits until the previous data is gone (the previous generation's registry field removed, no background frees left), and checks that the family holds exactly the new data and nothing else: no temp key, lock, or key of another generation.\n\n")

	p("| buckets | members each | items | rename publish, median (min–max) | per bucket | flip, median (min–max) | rename / flip (min–max) |\n")
	p("|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, sz := range g.Sizes {
		rn, gs := sz.Rename.Summary, sz.Generations.Summary
		renameCell, perBucket := fmt.Sprintf("not run (past -gen-rename-max %s)", commas(g.RenameMax)), "—"
		if est, from := renameEstimate(g.Sizes, sz.Buckets); from > 0 {
			renameCell += fmt.Sprintf(": ≈ %s, extrapolated from %s buckets", dur(est), commas(from))
		}
		if len(sz.Rename.Runs) > 0 {
			renameCell = fmt.Sprintf("%s (%s–%s)", dur(rn.Publish), dur(rn.PublishMin), dur(rn.PublishMax))
			perBucket = dur(rn.PerBucket)
		}
		p("| %s | %d | %s | %s | %s | **%s** (%s–%s) | %s |\n", commas(sz.Buckets), sz.Members, commas(sz.Items), renameCell, perBucket,
			dur(gs.Publish), dur(gs.PublishMin), dur(gs.PublishMax), ratioCell(sz.Ratio, sz.RatioMin, sz.RatioMax))
	}
	p("\nThe longest command of each run (median over rounds; the maximum and its command), the publish included; the longest of keyswap's own commands, ")
	p("which are all but its writes of the index's data (SADD to the generation's or the temp keys, the commands a raw writer of the same data sends too); the longest after the publish, ")
	p("which in Generations mode is the removal of the previous generation (its manifest read, or SCAN, and UNLINK in chunks) and the release; ")
	p("the wall time from the publish's reply until the previous data is gone, the grace period included; the run's wall time to the publish's reply, and the whole of `Run`, which in Generations mode waits for the grace period and removes the previous generation before it returns. ")
	p("**raw** is the baseline: the same data written by the raw method (no keyswap, no transaction) into a server holding the live family, in the same round: ")
	p("what its commands take (a set's growth, the server's hash table resizing, this machine's other processes preempting the server, which SLOWLOG counts) is not keyswap's.\n\n")
	p("| buckets | mode | longest command of the run | longest of keyswap's own | longest after the publish | previous data gone after | run to the publish | whole `Run` |\n")
	p("|--:|---|--:|--:|--:|--:|--:|--:|\n")
	for _, sz := range g.Sizes {
		if len(sz.Raw.Runs) > 0 {
			s := sz.Raw.Summary
			p("| %s | raw | %s | — | — | — | %s | — |\n", commas(sz.Buckets), commandCell(s.Longest, g.Threshold), dur(s.Published))
		}
		for _, x := range []struct {
			m  genMode
			gs genSeries
		}{{modeRename, sz.Rename}, {modeGenerations, sz.Generations}} {
			if len(x.gs.Runs) == 0 {
				continue
			}
			s := x.gs.Summary
			p("| %s | %s | %s | %s | %s | %s | %s | %s |\n", commas(sz.Buckets), x.m, commandCell(s.Longest, g.Threshold), commandCell(s.Own, g.Threshold),
				commandCell(s.AfterPublish, g.Threshold), dur(s.Cleanup), dur(s.Published), dur(s.Elapsed))
		}
	}
	p("\n")
	if c := g.CPU; c != nil {
		p("### CPU per entry\n\n")
		p("A family of %s buckets of %d members (%s entries), written by the limit (`redis-cli --pipe` into an empty server) and raw, and rebuilt in each mode onto a live family; %d rounds, interleaved. ",
			commas(c.Buckets), c.Members, commas(c.Items), g.Rounds)
		p("Server CPU is INFO's used_cpu_user + used_cpu_sys; for the modes it includes the removal of the previous data after the run, and so does their client CPU (getrusage of the bench). ")
		p("Items/s counts a run from its start to the publish's reply (in Generations mode Run then waits for the grace period, and removes the previous generation). Ratios are medians over rounds of the same round's ratio.\n\n")
		p("| method | items/s, median | server CPU per entry | server CPU / limit's (min–max) | client CPU per entry | client CPU / raw's (min–max) |\n")
		p("|---|--:|--:|--:|--:|--:|\n")
		for _, m := range c.Methods {
			s := m.Series.Summary
			p("| %s | %s | %s | %s | %s | %s |\n", m.Name, rate(s.Rate), perItem(s.ServerCPU, c.Items),
				ratioCell(m.ServerRatio, m.ServerRatioMin, m.ServerRatioMax), perItem(s.ClientCPU, c.Items), ratioCell(m.ClientRatio, m.ClientRatioMin, m.ClientRatioMax))
		}
		p("\n")
		c.phasesMarkdown(b)
	}
	if c := g.Cluster; c != nil {
		p("### On a cluster\n\n")
		p("A family of %s buckets of %d members (%s items) on the bench's own Redis Cluster of %d masters (redis-server %s, this machine's %d CPUs shared with the client): ",
			commas(c.Buckets), c.Members, commas(c.Items), c.Masters, c.Redis, cpus)
		p("without a hash tag, Generations mode spreads the buckets over every slot; with one, the family is on one master, as rename mode requires. ")
		p("%d rounds, interleaved. Items/s counts the run from its start to the publish's reply; CPU times include the removal of the previous data. The speedup is over Generations mode on one master, in the same round.\n\n", len(c.Runs[0].Series.Samples))
		p("| run | items/s, median (min–max) | speedup (min–max) | server CPU per master | client CPU | server CPU per item | client CPU per item |\n")
		p("|---|--:|--:|--:|--:|--:|--:|\n")
		for i, gs := range c.Runs {
			s := gs.Series.Summary
			cpu := make([]string, len(s.ServerCPU))
			for m, d := range s.ServerCPU {
				cpu[m] = secs(d)
			}
			speedup := "—"
			if i != 1 && s.Speedup != 0 {
				speedup = fmt.Sprintf("%.2f× (%.2f–%.2f)", s.Speedup, s.SpeedupMin, s.SpeedupMax)
			}
			p("| %s | %s (%s–%s) | %s | %s | %s | %s | %s |\n", gs.Title, rate(s.Rate), rate(s.RateMin), rate(s.RateMax), speedup,
				strings.Join(cpu, " / "), secs(s.ClientCPU), perItem(s.ServerPerItem, 1), perItem(s.ClientPerItem, 1))
		}
		p("\n")
	}
}
