package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
)

// env holds the package's redis-server, for the -addr test and the
// benchmarks. The smoke test starts its own, as the bench does by default.
var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, false)) }

// smokeArgs is the CI configuration: every section, tiny.
var smokeArgs = []string{"-n", "20000", "-rounds", "1", "-sizes", "2000,20000", "-batch-sizes", "100,1000", "-writers", "1,4",
	"-publish-buckets", "100,1000", "-publish-members", "3", "-cluster-rebuilders", "1,3", "-cluster-fields", "5000",
	"-gen-buckets", "100", "-gen-members", "2", "-gen-cpu-buckets", "100", "-gen-cluster-buckets", "100", "-gen-grace", "20ms"}

// TestRunSmoke runs every section of the bench against its own redis-server
// and checks the report's shape, never its numbers.
func TestRunSmoke(t *testing.T) {
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), append(slices.Clone(smokeArgs), "-out", out), &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	md := stdout.String()
	for _, want := range []string{
		"# keyswap bench, ", "go run ./bench -n 20000 -rounds 1",
		"## Summary", "keyswap / limit at 20,000 entries",
		"## Throughput", "| hash | **keyswap** |", "| sorted set | limit |", "| SetIndex (1000 buckets) | naive |", "| hash + sorted set + SetIndex | raw |",
		"### Server time per command",
		"## Swap pause", "| keyswap publish script", "| plain RENAME",
		"## Publish", "| 100 | 300 |", "| 1,000 | 3,000 |", "longest other commands", "EVALSHA acquire",
		"## Scaling", "| 2,000 |", "| 20,000 |",
		"## Knobs", "| BatchSize 100 |", "Writers 4",
		"## Cluster", "| 1 | 1 / 0 / 0 |", "| 3 | 1 / 1 / 1 |", "one client core carries about",
		"## Online", "**0 lost changes** in 2 runs",
		"## Generations", "| 100 | 2 | 200 |",
		"## Methods",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if !strings.Contains(stderr.String(), "100%") {
		t.Errorf("stderr has no finished progress bar:\n%s", stderr.String())
	}

	date := time.Now().UTC().Format("2006-01-02")
	for _, ext := range []string{".md", ".json", ".png", ".svg"} {
		if fi, err := os.Stat(filepath.Join(out, date+ext)); err != nil || fi.Size() == 0 {
			t.Errorf("%s%s: %v, want a non-empty file", date, ext, err)
		}
	}
	if saved, err := os.ReadFile(filepath.Join(out, date+".md")); err != nil || string(saved) != md {
		t.Errorf("%s.md differs from stdout (%v)", date, err)
	}
	var rep report
	js, _ := os.ReadFile(filepath.Join(out, date+".json"))
	if err := json.Unmarshal(js, &rep); err != nil {
		t.Fatalf("JSON: %v", err)
	}
	if rep.Throughput == nil || len(rep.Throughput.Workloads) != 5 {
		t.Fatalf("JSON throughput: got %+v, want 5 workloads", rep.Throughput)
	}
	for _, w := range rep.Throughput.Workloads {
		if len(w.Methods) != len(allMethods) {
			t.Errorf("JSON %s: got %d methods, want %d", w.Name, len(w.Methods), len(allMethods))
		}
		for _, m := range w.Methods {
			if len(m.Samples) != 1 || m.Samples[0].Items != 20000 {
				t.Errorf("JSON %s %s: got %d samples (%+v), want 1 of 20000 items", w.Name, m.Method, len(m.Samples), m.Samples)
			}
		}
	}
	if rep.Swap == nil || len(rep.Swap.Publish) != 1 || len(rep.Swap.Rename) != 1 {
		t.Errorf("JSON swap: got %+v, want 1 publish and 1 rename", rep.Swap)
	}
	if p := rep.Publish; p == nil || len(p.Sizes) != 2 {
		t.Errorf("JSON publish: got %+v, want 2 sizes", p)
	} else {
		for _, sz := range p.Sizes {
			if len(sz.Runs) != 1 || sz.Runs[0].Publish <= 0 || sz.Runs[0].Renewal.Keys != sz.Buckets || sz.Orphans != sz.Buckets/10 {
				t.Errorf("JSON publish, %d buckets: got %+v, want 1 run with a publish time, a renewal of every bucket and a tenth orphans", sz.Buckets, sz)
			}
		}
	}
	if rep.Scaling == nil || len(rep.Scaling.Sizes) != 2 {
		t.Errorf("JSON scaling: got %+v, want 2 sizes", rep.Scaling)
	}
	if rep.Knobs == nil || len(rep.Knobs.Cells) != 2 || len(rep.Knobs.Cells[0]) != 2 {
		t.Errorf("JSON knobs: got %+v, want 2×2 cells", rep.Knobs)
	}
	if c := rep.Cluster; c == nil || len(c.Runs) != 2 {
		t.Errorf("JSON cluster: got %+v, want 2 runs", c)
	} else {
		for _, cs := range c.Runs {
			if len(cs.Samples) != 1 || len(cs.Samples[0].Each) != cs.Rebuilders || len(cs.Samples[0].ServerCPU) != clusterMasters {
				t.Errorf("JSON cluster, %d Rebuilders: got %+v, want 1 sample with a time per Rebuilder and a CPU time per master", cs.Rebuilders, cs)
			}
		}
	}
	if rep.Online == nil || len(rep.Online.Runs) != 1 || rep.Online.Items != 20000 {
		t.Errorf("JSON online: got %+v, want 1 round of 20000 items", rep.Online)
	}

	// -render makes the same report again from the JSON.
	var again bytes.Buffer
	rendered := t.TempDir()
	if err := run(t.Context(), []string{"-render", filepath.Join(out, date+".json"), "-out", rendered}, &again, &stderr); err != nil {
		t.Fatalf("run -render: %v", err)
	}
	if _, err := os.Stat(filepath.Join(rendered, date+".png")); err != nil {
		t.Errorf("-render wrote no chart: %v", err)
	}
	if again.String() != md {
		t.Errorf("-render: got a different report:\n%s\nwant:\n%s", again.String(), md)
	}
}

// TestRunAddr runs the bench against a server it does not own: it must
// leave other keys and the slowlog settings alone.
func TestRunAddr(t *testing.T) {
	c := env.Standalone.Client(t)
	ctx := t.Context()
	const other = "not-the-bench:key"
	if err := c.Do(ctx, c.B().Set().Key(other).Value("kept").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	before := slowlogConfig(t, ctx)
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{"-addr", env.Standalone.Addr, "-n", "3000", "-rounds", "1", "-sections", "throughput,swap,publish",
		"-workloads", "setindex", "-publish-buckets", "50", "-publish-members", "2", "-out", "", "-progress=false"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	if got, err := c.Do(ctx, c.B().Get().Key(other).Build()).ToString(); err != nil || got != "kept" {
		t.Errorf("GET %s = %q, %v; want kept", other, got, err)
	}
	if after := slowlogConfig(t, ctx); !slices.Equal(after, before) {
		t.Errorf("slowlog settings: got %v after the run, want %v as before", after, before)
	}
	for _, unwanted := range []string{"## Scaling", "## Knobs", "| hash |"} {
		if strings.Contains(stdout.String(), unwanted) {
			t.Errorf("report has %q, which was not selected", unwanted)
		}
	}
}

func slowlogConfig(t *testing.T, ctx context.Context) []string {
	t.Helper()
	c := env.Standalone.Client(t)
	var out []string
	for _, name := range []string{"slowlog-log-slower-than", "slowlog-max-len"} {
		m, err := c.Do(ctx, c.B().ConfigGet().Parameter(name).Build()).AsStrMap()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m[name])
	}
	return out
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want error // nil, flag.ErrHelp, or a *usageError (any)
	}{
		{"defaults", nil, nil},
		{"help", []string{"-h"}, flag.ErrHelp},
		{"unknown flag", []string{"-bogus"}, &usageError{}},
		{"argument", []string{"extra"}, &usageError{}},
		{"zero n", []string{"-n", "0"}, &usageError{}},
		{"unknown section", []string{"-sections", "throughput,speed"}, &usageError{}},
		{"unknown workload", []string{"-workloads", "list"}, &usageError{}},
		{"unknown method", []string{"-methods", "fast"}, &usageError{}},
		{"bad size", []string{"-sizes", "10,x"}, &usageError{}},
		{"negative writers", []string{"-writers", "-1"}, &usageError{}},
		{"bad publish buckets", []string{"-publish-buckets", "1000,0"}, &usageError{}},
		{"zero publish members", []string{"-publish-members", "0"}, &usageError{}},
		{"bad cluster rebuilders", []string{"-cluster-rebuilders", "1,x"}, &usageError{}},
		{"zero cluster fields", []string{"-cluster-fields", "0"}, &usageError{}},
		{"bad gen buckets", []string{"-gen-buckets", "100,0"}, &usageError{}},
		{"zero gen members", []string{"-gen-members", "0"}, &usageError{}},
		{"zero gen grace", []string{"-gen-grace", "0"}, &usageError{}},
		{"negative gen rename max", []string{"-gen-rename-max", "-1"}, &usageError{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseFlags(tt.args, new(bytes.Buffer))
			switch tt.want.(type) {
			case nil:
				if err != nil {
					t.Errorf("got %v, want nil", err)
				}
			case *usageError:
				if !errors.As(err, new(*usageError)) {
					t.Errorf("got %v, want a usage error", err)
				}
			default:
				if !errors.Is(err, tt.want) {
					t.Errorf("got %v, want %v", err, tt.want)
				}
			}
		})
	}
}

func TestParseFlagsDefaults(t *testing.T) {
	cfg, err := parseFlags([]string{"-n", "20000", "-methods", "keyswap,limit", "-sections", "knobs,throughput"}, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{2000, 20000, 100000}; !slices.Equal(cfg.sizes, want) {
		t.Errorf("sizes: got %v, want %v", cfg.sizes, want)
	}
	if want := []method{methodLimit, methodKeyswap}; !slices.Equal(cfg.methods, want) {
		t.Errorf("methods: got %v, want %v (the order of a round)", cfg.methods, want)
	}
	if want := []string{sectionThroughput, sectionKnobs}; !slices.Equal(cfg.sections, want) {
		t.Errorf("sections: got %v, want %v", cfg.sections, want)
	}
}

func TestCommandLine(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "go run ./bench"},
		{[]string{"-n", "20000", "-rounds", "1"}, "go run ./bench -n 20000 -rounds 1"},
		{[]string{"-out", "my results"}, `go run ./bench -out "my results"`},
		{[]string{"-out", ""}, `go run ./bench -out ""`},
	}
	for _, tt := range tests {
		if got := commandLine(tt.args); got != tt.want {
			t.Errorf("commandLine(%q): got %q, want %q", tt.args, got, tt.want)
		}
	}
}

// runSection runs the bench with args, writing its files to a temporary
// directory, and returns the report it printed and the one its JSON holds.
func runSection(t *testing.T, args ...string) (md string, rep report, jsonPath string) {
	t.Helper()
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), append(args, "-out", out, "-progress=false"), &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	jsonPath = filepath.Join(out, time.Now().UTC().Format("2006-01-02")+".json")
	js, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &rep); err != nil {
		t.Fatalf("JSON: %v", err)
	}
	return stdout.String(), rep, jsonPath
}

// wantRender fails t unless -render makes md again from the JSON at path.
func wantRender(t *testing.T, path, md string) {
	t.Helper()
	var again, stderr bytes.Buffer
	if err := run(t.Context(), []string{"-render", path, "-out", ""}, &again, &stderr); err != nil {
		t.Fatalf("run -render: %v\nstderr:\n%s", err, stderr.String())
	}
	if again.String() != md {
		t.Errorf("-render: got a different report:\n%s\nwant:\n%s", again.String(), md)
	}
}

// sizeCase is a command line and the size of a section that it gives; 0
// wants a usage error.
type sizeCase struct {
	args  []string
	items int
}

// wantSizes checks each case: parseFlags gives a usage error for items 0,
// and otherwise a config whose size(cfg) is items, with section among the
// default sections.
func wantSizes(t *testing.T, section string, size func(config) int, cases []sizeCase) {
	t.Helper()
	for _, tt := range cases {
		cfg, err := parseFlags(tt.args, new(bytes.Buffer))
		if tt.items == 0 {
			if !errors.As(err, new(*usageError)) {
				t.Errorf("%q: got %v, want a usage error", tt.args, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: got %v, want nil", tt.args, err)
			continue
		}
		if got := size(cfg); got != tt.items {
			t.Errorf("%q: %s size got %d, want %d", tt.args, section, got, tt.items)
		}
		if !cfg.has(section) {
			t.Errorf("%q: sections %v, want %s among the defaults", tt.args, cfg.sections, section)
		}
	}
}
