package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/keyswap/keyswap/rebuild"
)

// targetRatio is the keyswap/limit ratio the bench checks the single-key
// workloads against.
const targetRatio = 0.95

// report is everything one run of the bench measured: the Markdown report
// and the JSON file are both made from it.
type report struct {
	Command    string            `json:"command"`
	Start      time.Time         `json:"start"`
	Duration   time.Duration     `json:"duration_ns"`
	Machine    machine           `json:"machine"`
	Items      int               `json:"items"`
	Rounds     int               `json:"rounds"`
	Throughput *throughputResult `json:"throughput,omitempty"`
	Swap       *swapResult       `json:"swap,omitempty"`
	Publish    *publishResult    `json:"publish,omitempty"`
	Scaling    *scalingResult    `json:"scaling,omitempty"`
	Knobs      *knobsResult      `json:"knobs,omitempty"`
	Cluster    *clusterResult    `json:"cluster,omitempty"`
	Online     *onlineResult     `json:"online,omitempty"`
	Impact     *impactResult     `json:"impact,omitempty"`
	// Generations is rename-in-place and Generations mode side by side.
	Generations *generationsResult `json:"generations,omitempty"`
	Notes       []string           `json:"notes,omitempty"`
}

// machine describes where the bench ran.
type machine struct {
	CPUs         int    `json:"cpus"`
	GOMAXPROCS   int    `json:"gomaxprocs"`
	CPUModel     string `json:"cpu_model"`
	Memory       string `json:"memory"`
	OS           string `json:"os"`
	Go           string `json:"go"`
	Redis        string `json:"redis_server"`
	RedisWhere   string `json:"redis_where"`
	RedisCLI     string `json:"redis_cli"`
	Nice         int    `json:"nice"`
	LoadAtStart  string `json:"loadavg_start"`
	LoadAtFinish string `json:"loadavg_end"`
}

// newReport starts the report of a run with cfg.
func newReport(ctx context.Context, cfg config, r *runner) *report {
	rep := &report{
		Command: commandLine(cfg.args),
		Start:   time.Now().UTC(),
		Items:   cfg.n,
		Rounds:  cfg.rounds,
		Machine: machine{
			CPUs:        runtime.NumCPU(),
			GOMAXPROCS:  runtime.GOMAXPROCS(0),
			CPUModel:    procField("/proc/cpuinfo", "model name"),
			Memory:      procField("/proc/meminfo", "MemTotal"),
			OS:          runtime.GOOS + "/" + runtime.GOARCH + " " + strings.TrimSpace(readFile("/proc/sys/kernel/osrelease")),
			Go:          runtime.Version(),
			Redis:       r.srv.version,
			Nice:        niceness(),
			LoadAtStart: loadAverage(),
		},
	}
	if r.srv.own != nil {
		rep.Machine.RedisWhere = `its own redis-server on a loopback port, --save "" --appendonly no`
	} else {
		rep.Machine.RedisWhere = "-addr " + cfg.addr
	}
	if r.hasLimit() {
		rep.Machine.RedisCLI = cliVersion(ctx, r.cli)
	}
	return rep
}

// finish records the end of the run.
func (rep *report) finish(r *runner) {
	rep.Duration = time.Since(rep.Start)
	rep.Machine.LoadAtFinish = loadAverage()
	rep.Notes = r.notes
}

// commandLine returns the command that reproduces the run.
func commandLine(args []string) string {
	parts := []string{"go", "run", "./bench"}
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"'$\\*?;&|<>()") {
			a = strconv.Quote(a)
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

func readFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return string(b)
}

// procField returns the first "name : value" field of a /proc file.
func procField(path, name string) string {
	for line := range strings.Lines(readFile(path)) {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// niceness returns the process's nice value, which redis-server and
// redis-cli inherit.
func niceness() int {
	prio, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		return 0
	}
	return 20 - prio // Linux's raw getpriority returns 20 - nice.
}

// loadAverage returns the 1, 5 and 15 minute load averages.
func loadAverage() string {
	f := strings.Fields(readFile("/proc/loadavg"))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// render writes the report of an earlier run from its JSON file, as write
// does: to stdout and, unless out is empty, to out/<date>.{md,json,png,svg}.
func render(path string, stdout io.Writer, out string) error {
	js, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rep report
	if err := json.Unmarshal(js, &rep); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return rep.write(stdout, out)
}

// write writes the Markdown report to stdout and, unless out is empty,
// the report, its JSON and its chart to out/<date>.{md,json,png,svg}.
func (rep *report) write(stdout io.Writer, out string) error {
	base := rep.Start.Format("2006-01-02")
	md := rep.markdown(base, out != "" && rep.Throughput != nil)
	if _, err := stdout.Write(md); err != nil {
		return err
	}
	if out == "" {
		return nil
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, base+".md"), md, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, base+".json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	if rep.Throughput != nil {
		for _, ext := range []string{".png", ".svg"} {
			if err := rep.Throughput.chart(filepath.Join(out, base+ext), rep.Command); err != nil {
				return fmt.Errorf("chart: %w", err)
			}
		}
	}
	return nil
}

// markdown renders the report. chart says whether <base>.png exists.
func (rep *report) markdown(base string, chart bool) []byte {
	var b bytes.Buffer
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	m := rep.Machine
	p("# keyswap bench, %s\n\n", rep.Start.Format("2006-01-02"))
	p("```sh\n%s\n```\n\n", rep.Command)
	p("| | |\n|---|---|\n")
	p("| date | %s UTC, the run took %s |\n", rep.Start.Format("2006-01-02 15:04"), rep.Duration.Round(time.Second))
	p("| machine | %d CPUs (%s), %s, %s |\n", m.CPUs, m.CPUModel, m.Memory, m.OS)
	p("| Go | %s, GOMAXPROCS %d |\n", m.Go, m.GOMAXPROCS)
	p("| Redis | redis-server %s: %s |\n", m.Redis, m.RedisWhere)
	if m.RedisCLI != "" {
		p("| limit | %s --pipe |\n", m.RedisCLI)
	}
	p("| load average (1, 5, 15 min) | %s at the start, %s at the end |\n", m.LoadAtStart, m.LoadAtFinish)
	if m.Nice != 0 {
		p("| priority | nice %d (the bench, its redis-server and redis-cli), against other load on the machine |\n", m.Nice)
	}
	p("| data | %s entries per run unless said otherwise: field `user:%%07d`, value `user%%07d@example.test` (24 bytes), integer scores, generated while the run streams it |\n", commas(rep.Items))
	order := "each method in turn"
	if t := rep.Throughput; t != nil && len(t.Workloads) > 0 {
		var ms []string
		for _, m := range t.Workloads[0].Methods {
			ms = append(ms, string(m.Method))
		}
		order = strings.Join(append(ms, ms[0], "…"), ", ")
	}
	p("| rounds | %d, interleaved (%s): medians and min–max over rounds |\n\n", rep.Rounds, order)

	rep.summaryMarkdown(&b)
	if t := rep.Throughput; t != nil {
		t.markdown(&b, base, chart)
	}
	if s := rep.Swap; s != nil {
		s.markdown(&b)
	}
	if pr := rep.Publish; pr != nil {
		pr.markdown(&b)
	}
	if s := rep.Scaling; s != nil {
		s.markdown(&b)
	}
	if k := rep.Knobs; k != nil {
		k.markdown(&b)
	}
	if c := rep.Cluster; c != nil {
		c.markdown(&b, rep.Machine.CPUs)
	}
	if o := rep.Online; o != nil {
		o.markdown(&b)
	}
	if im := rep.Impact; im != nil {
		im.markdown(&b, rep.Machine.CPUs)
	}
	if g := rep.Generations; g != nil {
		g.markdown(&b, rep.Machine.CPUs)
	}
	p("## Methods\n\n")
	for _, meth := range allMethods {
		p("- **%s**: %s.\n", meth, meth.describe())
	}
	p("\nServer CPU is INFO's used_cpu_user + used_cpu_sys over the run, all server threads; \"busy\" is server CPU over wall time. ")
	p("Client CPU is getrusage of the bench process (of redis-cli for the limit), which also generates the source's items; ")
	p("peak heap is the peak of the Go heap's objects, sampled every %v (redis-cli's maximum RSS for the limit). ", heapSampleEvery)
	p("After every run the bench checks the exact cardinality of every key and that no temp key or lock is left.\n")
	if len(rep.Notes) > 0 {
		p("\n## Notes\n\n")
		for _, n := range rep.Notes {
			p("- %s\n", n)
		}
	}
	return b.Bytes()
}

// summaryMarkdown writes the headline numbers.
func (rep *report) summaryMarkdown(b *bytes.Buffer) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	var lines []string
	if t := rep.Throughput; t != nil {
		for _, m := range []method{methodKeyswap, methodUnordered} {
			var parts []string
			met := true
			for _, w := range t.Workloads {
				k := w.method(m)
				if k == nil || k.Summary.Ratio == 0 || w.Name == "setindex" || w.Name == "multi" {
					continue
				}
				parts = append(parts, fmt.Sprintf("%s **%.2f**", w.Title, k.Summary.Ratio))
				met = met && k.Summary.Ratio >= targetRatio
			}
			if len(parts) == 0 {
				continue
			}
			verdict := "met"
			if !met {
				verdict = "not met"
			}
			name := "keyswap"
			if m == methodUnordered {
				name = "keyswap with `Options.Unordered`"
			}
			lines = append(lines, fmt.Sprintf("%s / limit at %s entries: %s (target ≥ %.2f: %s).",
				name, commas(t.Items), strings.Join(parts, ", "), targetRatio, verdict))
		}
	}
	if s := rep.Swap; s != nil {
		lines = append(lines, fmt.Sprintf("Swap pause onto a live %s-field hash: the publish blocks the server for **%s** (worst concurrent PING %s); a plain RENAME over it, %s (worst PING %s).",
			commas(s.Items), dur(s.Summary.PublishServer), dur(s.Summary.PublishPing), dur(s.Summary.RenameServer), dur(s.Summary.RenamePing)))
	}
	if pr := rep.Publish; pr != nil && len(pr.Sizes) > 0 {
		var sizes, times, per []string
		for _, sz := range pr.Sizes {
			sizes = append(sizes, commas(sz.Buckets))
			times = append(times, "**"+dur(sz.Summary.Publish)+"**")
			per = append(per, dur(sz.Summary.PerBucket))
		}
		line := fmt.Sprintf("Publish of a SetIndex family of %s buckets (%d members each, a tenth of the old buckets deleted as orphans): the script blocks the server for %s, %s per bucket.",
			strings.Join(sizes, " / "), pr.PerBucket, strings.Join(times, ", "), strings.Join(per, ", "))
		if top := pr.longestOther(); top.Command != "" {
			line += fmt.Sprintf(" The longest other command: %s, %s (median over rounds; at most %s); the longest renewal script, %s (at most %s).",
				top.Command, dur(top.Longest), dur(top.Max), dur(pr.longestRenewal(false)), dur(pr.longestRenewal(true)))
		}
		lines = append(lines, line)
	}
	if s := rep.Scaling; s != nil && len(s.Sizes) > 0 {
		var ratios, ns, heap []string
		for _, sz := range s.Sizes {
			ratios = append(ratios, fmt.Sprintf("%.2f", sz.Keyswap.Summary.Ratio))
			ns = append(ns, perItem(sz.Keyswap.Summary.ClientCPU, sz.Items))
			heap = append(heap, mib(sz.Keyswap.Summary.PeakHeap))
		}
		lines = append(lines, fmt.Sprintf("Scaling, hash, %s entries: keyswap / limit %s; keyswap's client CPU per entry %s, peak heap %s.",
			sizesList(s), strings.Join(ratios, ", "), strings.Join(ns, ", "), strings.Join(heap, ", ")))
	}
	if c := rep.Cluster; c != nil && len(c.Runs) > 0 {
		var parts []string
		for _, cs := range c.Runs {
			part := fmt.Sprintf("%d: %s items/s", cs.Rebuilders, rate(cs.Summary.Rate))
			if cs.Summary.Speedup != 0 && cs.Rebuilders != 1 {
				part += fmt.Sprintf(" (**%.2f×**)", cs.Summary.Speedup)
			}
			parts = append(parts, part)
		}
		lines = append(lines, fmt.Sprintf("Independent Rebuilders on a %d-master Redis Cluster, %s fields each, sharing %d CPUs with the client: %s.",
			c.Masters, commas(c.Fields), rep.Machine.CPUs, strings.Join(parts, ", ")))
	}
	if o := rep.Online; o != nil {
		lines = append(lines, o.summaryLine())
	}
	if im := rep.Impact; im != nil {
		lines = append(lines, im.summaryLine())
	}
	if g := rep.Generations; g != nil {
		lines = append(lines, g.summaryLine())
	}
	if len(lines) == 0 {
		return
	}
	p("## Summary\n\n")
	for _, l := range lines {
		p("- %s\n", l)
	}
	p("\n")
}

func sizesList(s *scalingResult) string {
	var out []string
	for _, sz := range s.Sizes {
		out = append(out, commas(sz.Items))
	}
	return strings.Join(out, " / ")
}

// markdown writes the throughput section.
func (t *throughputResult) markdown(b *bytes.Buffer, base string, chart bool) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("## Throughput\n\n")
	p("%s entries per run, %d rounds. Items/s counts source items; the multi workload writes 3 entries per item.\n\n", commas(t.Items), t.Rounds)
	if chart {
		p("![items/s per method and workload, with the limit as a line](%s.png)\n\n", base)
	}
	p("| workload | method | items/s, median | min–max | ratio to limit (min–max) | server CPU | server busy | client CPU | peak heap | allocs/item |\n")
	p("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, w := range t.Workloads {
		for _, m := range w.Methods {
			s := m.Summary
			name := string(m.Method)
			if m.Method == methodKeyswap {
				name = "**keyswap**"
			}
			ratio := "—"
			if s.Ratio != 0 && m.Method != methodLimit {
				ratio = fmt.Sprintf("%.2f (%.2f–%.2f)", s.Ratio, s.RatioMin, s.RatioMax)
			}
			allocs := fmt.Sprintf("%.2f", s.AllocsPerItem)
			if m.Method == methodLimit {
				allocs = "—"
			}
			p("| %s | %s | %s | %s–%s | %s | %s | %.0f%% | %s | %s | %s |\n", w.Title, name,
				rate(s.Rate), rate(s.RateMin), rate(s.RateMax), ratio,
				secs(s.ServerCPU), 100*s.ServerUtil, secs(s.ClientCPU), heapCell(m.Method, s.PeakHeap), allocs)
		}
	}
	p("\n### Server time per command\n\n")
	p("INFO commandstats over a run, mean of the rounds: calls, and time spent executing them (parsing and I/O excluded).\n\n")
	p("| workload | method | commands |\n|---|---|---|\n")
	for _, w := range t.Workloads {
		for _, m := range w.Methods {
			p("| %s | %s | %s |\n", w.Title, m.Method, commandsCell(m.Samples, 0))
		}
	}
	p("\n")
}

// commandsCell formats the mean commandstats of samples, busiest first:
// the top commands, or all of them for top 0.
func commandsCell(samples []sample, top int) string {
	type agg struct {
		name        string
		calls, usec int64
	}
	sum := map[string]*agg{}
	for _, s := range samples {
		for name, st := range s.Commands {
			a := sum[name]
			if a == nil {
				a = &agg{name: name}
				sum[name] = a
			}
			a.calls += st.Calls
			a.usec += st.Usec
		}
	}
	all := slices.Collect(maps.Values(sum))
	slices.SortFunc(all, func(a, b *agg) int {
		if a.usec != b.usec {
			return int(b.usec - a.usec)
		}
		return strings.Compare(a.name, b.name)
	})
	var parts []string
	n := int64(max(len(samples), 1))
	for _, a := range all {
		if strings.HasPrefix(a.name, "info") || a.calls < n {
			continue // the bench's own INFO, and what is not part of every run (reconnects, keepalive)
		}
		if a.name == "exec" {
			// EXEC's time is that of the commands it runs, listed apart.
			parts = append(parts, fmt.Sprintf("EXEC %s (running the queued commands)", commas(int(a.calls/n))))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %s × %.2f µs = %s", strings.ToUpper(a.name), commas(int(a.calls/n)),
			float64(a.usec)/float64(max(a.calls, 1)), dur(time.Duration(a.usec/n)*time.Microsecond)))
		if len(parts) == top {
			parts = append(parts, "…")
			break
		}
	}
	return strings.Join(parts, "; ")
}

// markdown writes the swap section.
func (s *swapResult) markdown(b *bytes.Buffer) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	sm := s.Summary
	p("## Swap pause\n\n")
	p("A keyswap rebuild of a %s-field hash onto a live hash of %s fields, next to a plain RENAME of a %s-field hash over it; %d rounds. ",
		commas(s.Items), commas(s.Items), commas(s.Items), len(s.Publish))
	p("Server time is the command's SLOWLOG duration; the worst PING is the longest round trip of a probe pinging on its own connection while the command ran (idle PING: %s).\n\n", dur(sm.IdlePing))
	p("| command | server time, median (max) | worst PING, median (max) |\n|---|--:|--:|\n")
	p("| keyswap publish script (UNLINK old, RENAME, PERSIST) | %s (%s) | %s (%s) |\n", dur(sm.PublishServer), dur(sm.PublishServerMax), dur(sm.PublishPing), dur(sm.PublishPingMax))
	p("| plain RENAME over the live key | %s (%s) | %s (%s) |\n\n", dur(sm.RenameServer), dur(sm.RenameServerMax), dur(sm.RenamePing), dur(sm.RenamePingMax))
}

// longestOther returns the command other than the publish whose longest
// call, median over rounds, is the longest of any size.
func (pr *publishResult) longestOther() commandTime {
	var top commandTime
	for _, sz := range pr.Sizes {
		if l := sz.Summary.Longest; len(l) > 0 && l[0].Longest > top.Longest {
			top = l[0]
		}
	}
	return top
}

// longestRenewal returns the longest renewal script, refresh or heartbeat,
// of any size: median over rounds, or the maximum.
func (pr *publishResult) longestRenewal(maximum bool) time.Duration {
	var d time.Duration
	for _, sz := range pr.Sizes {
		rn := sz.Summary.Renewal
		if maximum {
			rn = sz.Summary.RenewalMax
		}
		d = max(d, rn.RefreshLongest, rn.Heartbeat)
	}
	return d
}

// markdown writes the publish section.
func (pr *publishResult) markdown(b *bytes.Buffer) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("## Publish\n\n")
	p("A SetIndex family of %d members per bucket rebuilt with keyswap (default options unless the command says otherwise) onto a live family of as many buckets, ", pr.PerBucket)
	p("a tenth of which the new data no longer has: the publish replaces nine tenths of the live buckets, deletes the other tenth (orphans) and creates as many new ones, all in one script. ")
	p("%d rounds, the sizes interleaved. Server times are SLOWLOG's execution times, during which the server serves no other client; ", pr.Rounds)
	p("it logs the commands of %s or more (the runs pay about a microsecond for each).\n\n", dur(pr.Threshold))
	p("| buckets | members | keys in the publish | publish server time, median | min–max | per bucket | publish round trip | run wall time | build items/s (min–max) |\n")
	p("|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, sz := range pr.Sizes {
		s := sz.Summary
		p("| %s | %s | %s | **%s** | %s–%s | %s | %s | %s | %s (%s–%s) |\n", commas(sz.Buckets), commas(sz.Items), commas(s.PublishKeys),
			dur(s.Publish), dur(s.PublishMin), dur(s.PublishMax), dur(s.PerBucket), dur(s.PublishCall), dur(s.Elapsed),
			rate(s.BuildRate), rate(s.BuildRateMin), rate(s.BuildRateMax))
	}
	for _, sz := range pr.Sizes {
		over := 0
		for _, r := range sz.Runs {
			if pr.BusyThreshold > 0 && r.Publish > pr.BusyThreshold {
				over++
			}
		}
		if over > 0 {
			p("\nAt %s buckets the publish ran past the server's busy-reply-threshold (%s) in %d of %d rounds: from then until it ended, the server answered every other client's commands with a BUSY error instead of serving them late; a script that has written cannot be killed (SCRIPT KILL), only the server shut down.\n",
				commas(sz.Buckets), dur(pr.BusyThreshold), over, len(sz.Runs))
		}
	}
	p("\nEvery other command of the runs: the three longest commands, by the median over rounds of their longest call in the round (its maximum, and their most calls in one run), ")
	p("the MULTI/EXEC batches (other clients wait behind a whole transaction: its mean time, from INFO commandstats), ")
	p("and a renewal of the complete family sent by the bench just before the publish, as the lease sends one every TTL/3 (TTL %g s) in runs long enough to see every bucket written: ", pr.TTL.Seconds())
	p("the refresh of every temp key, at most %d per script, and a heartbeat, each script timed alone by INFO commandstats: medians over rounds (maxima). ", pr.RefreshChunk)
	p("SLOWLOG and commandstats time a command by the wall clock: on a loaded machine a command during which the server was descheduled looks longer than it ran, hence the medians.\n\n")
	p("| buckets | longest other commands: median (max; calls per run) | MULTI/EXEC: calls, mean | refresh of every temp key: scripts, longest, total | heartbeat |\n")
	p("|--:|---|--:|--:|--:|\n")
	for _, sz := range pr.Sizes {
		s := sz.Summary
		var top []string
		for _, ct := range s.Longest[:min(3, len(s.Longest))] {
			top = append(top, fmt.Sprintf("%s %s (%s; %s)", ct.Command, dur(ct.Longest), dur(ct.Max), commas(ct.Calls)))
		}
		rn, rx := s.Renewal, s.RenewalMax
		p("| %s | %s | %s × %s | %s × ≤%d keys, %s (%s), %s (%s) | %s (%s) |\n", commas(sz.Buckets), strings.Join(top, "; "),
			commas(s.ExecCalls), dur(s.ExecMean), commas(rn.Scripts), min(rn.Keys, pr.RefreshChunk),
			dur(rn.RefreshLongest), dur(rx.RefreshLongest), dur(rn.RefreshTotal), dur(rx.RefreshTotal), dur(rn.Heartbeat), dur(rx.Heartbeat))
	}
	p("\nServer time per command (INFO commandstats, mean of the rounds, the renewal excluded; the commands a script runs are counted under their own names and in the script's time):\n\n")
	p("| buckets | commands |\n|--:|---|\n")
	for _, sz := range pr.Sizes {
		var samples []sample
		for _, r := range sz.Runs {
			samples = append(samples, sample{Commands: r.Commands})
		}
		p("| %s | %s |\n", commas(sz.Buckets), commandsCell(samples, 9))
	}
	p("\n")
}

// markdown writes the scaling section.
func (s *scalingResult) markdown(b *bytes.Buffer) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("## Scaling\n\n")
	p("A hash rebuilt onto a live hash of the same size, next to the limit writing the same hash; %d rounds, medians. ", s.Rounds)
	p("The server's own cost per entry grows with the size of the hash (its table outgrows the CPU caches), for the limit as much as for keyswap; ")
	p("what keyswap adds should not: its ratio to the limit, its client CPU per entry and its peak heap.\n\n")
	p("| entries | limit items/s | keyswap items/s | ratio to limit | limit wall per entry | keyswap wall per entry | keyswap server CPU per entry | keyswap client CPU per entry | keyswap peak heap |\n")
	p("|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, sz := range s.Sizes {
		k := sz.Keyswap.Summary
		limit, ratio, limitNs := "—", "—", "—"
		if sz.Limit != nil {
			limit = rate(sz.Limit.Summary.Rate)
			ratio = fmt.Sprintf("%.2f", k.Ratio)
			limitNs = fmt.Sprintf("%.2f µs", sz.Limit.Summary.NsPerItem/1e3)
		}
		p("| %s | %s | %s | %s | %s | %.2f µs | %s | %s | %s |\n", commas(sz.Items), limit, rate(k.Rate), ratio,
			limitNs, k.NsPerItem/1e3, perItem(k.ServerCPU, sz.Items), perItem(k.ClientCPU, sz.Items), mib(k.PeakHeap))
	}
	p("\n")
}

// perItem formats d per item in µs.
func perItem(d time.Duration, items int) string {
	return fmt.Sprintf("%.2f µs", float64(d.Nanoseconds())/float64(items)/1e3)
}

// markdown writes the knobs section.
func (k *knobsResult) markdown(b *bytes.Buffer) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("## Knobs\n\n")
	p("keyswap on a %s-field hash with each `BatchSize` × `Writers`, %d rounds; the defaults are %d × %d (marked *), the best cell is bold.", commas(k.Items), k.Rounds, rebuild.Defaults().BatchSize, rebuild.Defaults().Writers)
	if k.Limit != nil {
		p(" The limit ran %s items/s.", rate(k.Limit.Summary.Rate))
	}
	p("\n\n")
	best := 0.0
	for _, row := range k.Cells {
		for _, c := range row {
			best = max(best, c.Summary.Rate)
		}
	}
	table := func(title string, cell func(series) string) {
		p("| %s | ", title)
		for _, w := range k.Writers {
			p("Writers %d | ", w)
		}
		p("\n|--:|%s\n", strings.Repeat("--:|", len(k.Writers)))
		for i, bs := range k.BatchSizes {
			p("| BatchSize %d |", bs)
			for j, w := range k.Writers {
				c := k.Cells[i][j]
				text := cell(c)
				if bs == rebuild.Defaults().BatchSize && w == rebuild.Defaults().Writers {
					text += " *"
				}
				if c.Summary.Rate == best {
					text = "**" + text + "**"
				}
				p(" %s |", text)
			}
			p("\n")
		}
		p("\n")
	}
	table("items/s (ratio to limit)", func(s series) string {
		if s.Summary.Ratio == 0 {
			return rate(s.Summary.Rate)
		}
		return fmt.Sprintf("%s (%.2f)", rate(s.Summary.Rate), s.Summary.Ratio)
	})
	table("peak heap", func(s series) string { return mib(s.Summary.PeakHeap) })
}

// markdown writes the cluster section; cpus is the machine's.
func (c *clusterResult) markdown(b *bytes.Buffer, cpus int) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("## Cluster\n\n")
	p("Independent Rebuilders run at once, each rebuilding a hash of its own of %s fields onto a live hash of as many, ", commas(c.Fields))
	p("on a Redis Cluster of %d masters without replicas (redis-server %s, the bench's own processes on loopback ports), ", c.Masters, c.Redis)
	p("all through one rueidis cluster client in the bench's process; Rebuilder i's hash tag places its key on master i mod %d. ", c.Masters)
	p("%d rounds, interleaved. Items/s is all items over the wall time of the slowest Rebuilder; summed is the sum of each Rebuilder's own items/s; ", c.Rounds)
	p("the speedup is over one Rebuilder alone on one master of the same cluster, in the same round. Server CPU is each master's INFO used_cpu_user + used_cpu_sys over the run; ")
	p("client CPU is getrusage of the bench, which also generates every source's items; cores busy is all of it over wall time. ")
	p("After every run the bench checks every hash's exact cardinality, that it is on its master, and that no temp key or lock is left on any node.\n\n")
	p("| Rebuilders | per master | items/s, median | min–max | summed items/s | speedup (min–max) | server CPU per master | client CPU | cores busy | server CPU per item | client CPU per item |\n")
	p("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	var single, most *clusterSeries
	for i := range c.Runs {
		cs := &c.Runs[i]
		s := cs.Summary
		if cs.Rebuilders == 1 {
			single = cs
		}
		if most == nil || cs.Rebuilders > most.Rebuilders {
			most = cs
		}
		per := make([]string, len(cs.PerMaster))
		for m, n := range cs.PerMaster {
			per[m] = strconv.Itoa(n)
		}
		speedup := "—"
		if s.Speedup != 0 && cs.Rebuilders != 1 {
			speedup = fmt.Sprintf("%.2f× (%.2f–%.2f)", s.Speedup, s.SpeedupMin, s.SpeedupMax)
		}
		cpu := make([]string, len(s.ServerCPU))
		for m, d := range s.ServerCPU {
			cpu[m] = secs(d)
		}
		p("| %d | %s | %s | %s–%s | %s | %s | %s | %s | %.2f | %s | %s |\n", cs.Rebuilders, strings.Join(per, " / "),
			rate(s.Rate), rate(s.RateMin), rate(s.RateMax), rate(s.Summed), speedup, strings.Join(cpu, " / "), secs(s.ClientCPU), s.Cores,
			perItem(s.ServerPerItem, 1), perItem(s.ClientPerItem, 1))
	}
	p("\n")
	if single == nil || most == nil || most.Rebuilders == 1 || most.Summary.ClientPerItem <= 0 {
		return
	}
	// What the numbers mean for a machine with a core per master.
	ss, ms := single.Summary, most.Summary
	perCore := float64(time.Second) / float64(ms.ClientPerItem)
	p("This machine has %d CPUs, so the %d masters and the client compete for them: %d Rebuilders kept %.2f cores busy", cpus, c.Masters, most.Rebuilders, ms.Cores)
	if ms.Cores < float64(cpus)-0.5 {
		p(" (the rest went to other processes on the machine: see the load average)")
	}
	p(", and reached %.2f× the single Rebuilder's %s items/s; the servers' CPU per item rose from %s alone to %s, as processes that share cores run slower. ",
		ms.Speedup, rate(ss.Rate), perItem(ss.ServerPerItem, 1), perItem(ms.ServerPerItem, 1))
	p("On a machine with a core per master and cores of its own for the client, each master would serve its Rebuilders as fast as one master serves one here, ")
	p("so expect near-linear scaling in the number of masters until the client's own CPU or the network is the limit: ")
	p("the client spent %s of CPU per item with %d Rebuilders, so one client core carries about %s items/s, %.1f× the single Rebuilder's rate ",
		perItem(ms.ClientPerItem, 1), most.Rebuilders, rate(perCore), perCore/ss.Rate)
	p("(the client uses as many cores as GOMAXPROCS gives it).\n\n")
}

// rate formats items per second.
func rate(r float64) string {
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%.3f M", r/1e6)
	case r >= 1e3:
		return fmt.Sprintf("%.1f k", r/1e3)
	}
	return fmt.Sprintf("%.0f", r)
}

// secs formats a CPU time in seconds.
func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

// dur formats a short duration with 3 significant digits.
func dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.3g s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.3g ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.3g µs", float64(d)/float64(time.Microsecond))
}

// mib formats bytes in MiB.
func mib(n uint64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// heapCell formats a peak heap, which for the limit is redis-cli's RSS.
func heapCell(m method, n uint64) string {
	if m == methodLimit {
		return mib(n) + " RSS"
	}
	return mib(n)
}

// commas formats n with thousands separators.
func commas(n int) string {
	s := strconv.Itoa(n)
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}
