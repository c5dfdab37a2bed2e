package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
)

// The methods of the CPU part that write the new data with redis-cli --pipe
// into a server holding the previous generation, then delete exactly the
// previous generation's keys with redis-cli --pipe: the limit of a run
// plus the removal of what it replaces, with either command.
const (
	methodPipeUnlink = "pipe write + pipe UNLINK"
	methodPipeDel    = "pipe write + pipe DEL"
)

// pipeDeleteCommand is the deleting command of a pipe method.
var pipeDeleteCommand = map[string]string{methodPipeUnlink: "UNLINK", methodPipeDel: "DEL"}

// genPhases is a run's server usage in two phases: the build, from its
// start to the publish's reply (for a pipe method, the pipe's writes), and
// the removal of the previous data, from the publish's reply until it is
// gone (for a pipe method, the pipe's deletes): CPU time (INFO cpu) and
// INFO commandstats, INFO's own calls left out.
type genPhases struct {
	Build           time.Duration          `json:"build_server_cpu_ns"`
	Removal         time.Duration          `json:"removal_server_cpu_ns"`
	BuildCommands   map[string]commandStat `json:"build_commands"`
	RemovalCommands map[string]commandStat `json:"removal_commands"`
}

// newPhases returns the phases between the usages before, at the publish's
// reply and after.
func newPhases(before, published, after serverUsage) genPhases {
	b, r := published.since(before), after.since(published)
	delete(b.commands, "info")
	delete(r.commands, "info")
	return genPhases{Build: b.cpu, Removal: r.cpu, BuildCommands: b.commands, RemovalCommands: r.commands}
}

// phaseSummary is, for one method, medians over rounds of its phases, and
// of the ratios of the same round's phases to the pipe methods'.
type phaseSummary struct {
	Build   time.Duration `json:"build_server_cpu_ns_median"`
	Removal time.Duration `json:"removal_server_cpu_ns_median"`
	Total   time.Duration `json:"total_server_cpu_ns_median"`
	// BuildRatio is the build over the pipe write's (of methodPipeUnlink);
	// RemovalRatio and TotalRatio over the pipe methods', by method.
	BuildRatio   ratioRange            `json:"build_ratio_to_pipe_write"`
	RemovalRatio map[string]ratioRange `json:"removal_ratio_to_pipe_delete,omitempty"`
	TotalRatio   map[string]ratioRange `json:"total_ratio_to_pipe,omitempty"`
	// Commands are the removal's commands: per command, the median over
	// rounds of its calls and of its time.
	Commands map[string]commandStat `json:"removal_commands_median"`
}

// ratioRange is a median over rounds of a ratio, and its range.
type ratioRange struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// pairedPhaseRatio returns the ratio over rounds of f of a's phases over
// f of b's, the same round's.
func pairedPhaseRatio(a, b []genPhases, f func(genPhases) time.Duration) ratioRange {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if f(b[i]) > 0 {
			rs = append(rs, float64(f(a[i]))/float64(f(b[i])))
		}
	}
	if len(rs) == 0 {
		return ratioRange{}
	}
	return ratioRange{median(rs), slices.Min(rs), slices.Max(rs)}
}

func phaseBuild(p genPhases) time.Duration   { return p.Build }
func phaseRemoval(p genPhases) time.Duration { return p.Removal }
func phaseTotal(p genPhases) time.Duration   { return p.Build + p.Removal }

// summarizePhases fills the phase summary of every method with phases.
func (g *genCPU) summarizePhases() {
	pipe := g.method(methodPipeUnlink)
	for i := range g.Methods {
		m := &g.Methods[i]
		if len(m.Phases) == 0 {
			continue
		}
		s := &phaseSummary{RemovalRatio: map[string]ratioRange{}, TotalRatio: map[string]ratioRange{}, Commands: map[string]commandStat{}}
		durs := func(f func(genPhases) time.Duration) time.Duration {
			var ds []time.Duration
			for _, p := range m.Phases {
				ds = append(ds, f(p))
			}
			return medianDuration(ds)
		}
		s.Build, s.Removal, s.Total = durs(phaseBuild), durs(phaseRemoval), durs(phaseTotal)
		if pipe != nil && m.Name != methodPipeUnlink {
			s.BuildRatio = pairedPhaseRatio(m.Phases, pipe.Phases, phaseBuild)
		}
		for _, name := range []string{methodPipeUnlink, methodPipeDel} {
			if p := g.method(name); p != nil && m.Name != name {
				s.RemovalRatio[name] = pairedPhaseRatio(m.Phases, p.Phases, phaseRemoval)
				s.TotalRatio[name] = pairedPhaseRatio(m.Phases, p.Phases, phaseTotal)
			}
		}
		names := map[string]bool{}
		for _, p := range m.Phases {
			for c := range p.RemovalCommands {
				names[c] = true
			}
		}
		for c := range names {
			var calls, usec []float64
			for _, p := range m.Phases {
				calls = append(calls, float64(p.RemovalCommands[c].Calls))
				usec = append(usec, float64(p.RemovalCommands[c].Usec))
			}
			s.Commands[c] = commandStat{Calls: int64(median(calls)), Usec: int64(median(usec))}
		}
		m.Phase = s
	}
}

// pipeFiles are the pre-generated inputs of the pipe methods for one
// previous generation: the new data's SADDs onto the next generation's
// keys, and the deletes of the previous generation's keys by command.
type pipeFiles struct {
	write respFile
	del   map[string]respFile
}

func (p pipeFiles) remove() {
	os.Remove(p.write.path)
	for _, f := range p.del {
		os.Remove(f.path)
	}
}

// writePipeFiles writes the pipe methods' inputs for a family whose
// previous generation is old: d written under generation old+1, and the
// previous dataset's buckets of generation old deleted, perCommand keys
// per command.
func writePipeFiles(f genFamily, d dataset, old int64) (_ pipeFiles, err error) {
	out := pipeFiles{del: map[string]respFile{}}
	defer func() {
		if err != nil {
			out.remove()
		}
	}()
	next := strings.TrimSuffix(keys.GenPrefix(f.prefix(), old+1), ":")
	w := workload{name: "family", title: "SetIndex family", targets: []target{{kindIndex, next}}}
	if out.write, err = writeRESP(w, d); err != nil {
		return out, err
	}
	prev := d.previous()
	names := make([]string, prev.bucketCount())
	for i, b := range prev.buckets[:prev.bucketCount()] {
		names[i] = keys.GenBucketKey(f.prefix(), old, b)
	}
	for _, cmd := range slices.Sorted(maps.Values(pipeDeleteCommand)) {
		if out.del[cmd], err = writeDeletes(cmd, names); err != nil {
			return out, err
		}
	}
	return out, nil
}

// writeDeletes writes RESP that deletes names with cmd, perCommand keys
// per command.
func writeDeletes(cmd string, names []string) (_ respFile, err error) {
	f, err := os.CreateTemp("", "keyswap-bench-*.resp")
	if err != nil {
		return respFile{}, err
	}
	out := respFile{path: f.Name()}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	for chunk := range slices.Chunk(names, perCommand) {
		fmt.Fprintf(bw, "*%d\r\n$%d\r\n%s\r\n", len(chunk)+1, len(cmd), cmd)
		for _, k := range chunk {
			fmt.Fprintf(bw, "$%d\r\n%s\r\n", len(k), k)
		}
		out.commands++
	}
	return out, bw.Flush()
}

// genPipe measures a pipe method: onto a live family of d.previous()
// published in Generations mode, redis-cli --pipe writes d under the next
// generation's keys, then deletes every key of the previous generation
// with the method's command. files caches the inputs by previous
// generation.
func (r *runner) genPipe(ctx context.Context, f genFamily, name string, d dataset, round int, files map[int64]pipeFiles) (sample, genPhases, error) {
	r.bar.describe("%s %d/%d: %s, SetIndex of %s buckets", sectionGenerations, round+1, r.cfg.rounds, name, commas(d.bucketCount()))
	s := r.srv
	old, had, err := f.prepare(ctx, modeGenerations, r.genOptions(modeGenerations), d)
	if err != nil {
		return sample{}, genPhases{}, err
	}
	if !had {
		return sample{}, genPhases{}, errors.New("the prepared family has no generation")
	}
	in, ok := files[old]
	if !ok {
		if in, err = writePipeFiles(f, d, old); err != nil {
			return sample{}, genPhases{}, err
		}
		files[old] = in
	}
	before, err := s.usage(ctx)
	if err != nil {
		return sample{}, genPhases{}, err
	}
	start := time.Now()
	wrote, err := runLimit(ctx, r.cli, s, in.write)
	if err != nil {
		return sample{}, genPhases{}, err
	}
	elapsed := time.Since(start)
	mid, err := s.usage(ctx)
	if err != nil {
		return sample{}, genPhases{}, err
	}
	deleted, err := runLimit(ctx, r.cli, s, in.del[pipeDeleteCommand[name]])
	if err == nil {
		err = f.settle(ctx)
	}
	if err != nil {
		return sample{}, genPhases{}, err
	}
	after, err := s.usage(ctx)
	if err != nil {
		return sample{}, genPhases{}, err
	}
	if err := f.checkPipe(ctx, d, old); err != nil {
		return sample{}, genPhases{}, fmt.Errorf("wrong result: %w", err)
	}
	r.bar.step()
	smp := sample{Items: d.n, Elapsed: elapsed, ServerCPU: after.cpu - before.cpu, ClientCPU: wrote.cpu + deleted.cpu, PeakHeap: max(wrote.maxRSS, deleted.maxRSS)}
	return smp, newPhases(before, mid, after), nil
}

// checkPipe checks that a pipe method left no key of generation old and
// every bucket of d under generation old+1.
func (f genFamily) checkPipe(ctx context.Context, d dataset, old int64) error {
	all, err := f.allKeys(ctx)
	if err != nil {
		return err
	}
	prev, next := keys.GenPrefix(f.prefix(), old), keys.GenPrefix(f.prefix(), old+1)
	var left, written int
	for _, k := range all {
		switch {
		case strings.HasPrefix(k, prev):
			left++
		case strings.HasPrefix(k, next):
			written++
		}
	}
	if left != 0 || written != d.bucketCount() {
		return fmt.Errorf("%d keys of generation %d left (want none), %d buckets of generation %d (want %s)", left, old, written, old+1, strconv.Itoa(d.bucketCount()))
	}
	return nil
}

// rangeCell formats a ratio range, or "—" for none.
func rangeCell(r ratioRange) string { return ratioCell(r.Median, r.Min, r.Max) }

// phasesMarkdown writes the CPU part's build and removal phases: the
// server CPU of each, against the pipe methods', and the removal's
// commands.
func (g *genCPU) phasesMarkdown(b *bytes.Buffer) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	var with []genMethod
	for _, m := range g.Methods {
		if m.Phase != nil {
			with = append(with, m)
		}
	}
	if len(with) == 0 {
		return
	}
	p("#### Build and removal\n\n")
	p("The same runs split at the publish's reply: the **build** (to the reply) and the **removal** of the previous data (after it, until the previous data is gone: in Generations mode the grace period and the removal of the previous generation, in rename mode the frees of the replaced values). ")
	p("The like-for-like limits: `%s` pipes the new data with redis-cli into a server that holds the previous generation (onto the next generation's keys: the build's limit), then pipes %s of exactly the previous generation's keys, %d per command (the removal's limit); `%s` deletes them with DEL. ", methodPipeUnlink, "UNLINK", perCommand, methodPipeDel)
	p("Server CPU per entry is INFO's used_cpu_user + used_cpu_sys in each phase over the entries; ratios are medians over rounds of the same round's ratio (min–max).\n\n")
	p("| method | build | removal | total | build / pipe write | removal / pipe UNLINK | removal / pipe DEL | total / (pipe write + UNLINK) | total / (pipe write + DEL) |\n")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, m := range with {
		s := m.Phase
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", m.Name, perItem(s.Build, g.Items), perItem(s.Removal, g.Items), perItem(s.Total, g.Items),
			rangeCell(s.BuildRatio), rangeCell(s.RemovalRatio[methodPipeUnlink]), rangeCell(s.RemovalRatio[methodPipeDel]),
			rangeCell(s.TotalRatio[methodPipeUnlink]), rangeCell(s.TotalRatio[methodPipeDel]))
	}
	p("\nThe removal's commands (INFO commandstats, medians over rounds): calls, server time per entry of the family and per call. ")
	p("A script's commands count twice: in their own line and in the script's (EVALSHA), whose time includes theirs.\n\n")
	p("| method | command | calls | µs per entry | µs per call |\n")
	p("|---|---|--:|--:|--:|\n")
	for _, m := range with {
		cs := m.Phase.Commands
		// The costliest first; the same cost by name, so that -render of the
		// JSON writes the same report.
		names := slices.SortedFunc(maps.Keys(cs), func(a, b string) int {
			return cmp.Or(cmp.Compare(cs[b].Usec, cs[a].Usec), cmp.Compare(a, b))
		})
		for _, c := range names {
			st := cs[c]
			if st.Calls == 0 {
				continue
			}
			p("| %s | %s | %s | %.3f | %.1f |\n", m.Name, strings.ToUpper(c), commas(int(st.Calls)), float64(st.Usec)/float64(g.Items), float64(st.Usec)/float64(st.Calls))
		}
	}
	p("\n")
}
