package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
)

func TestGenMembers(t *testing.T) {
	for _, tt := range []struct{ buckets, members, maxItems, want int }{
		{1000, 10, 2_000_000, 10},
		{1_000_000, 10, 2_000_000, 2},
		{3_000_000, 10, 2_000_000, 1}, // at least one
		{100, 3, 150, 1},
	} {
		if got := genMembers(tt.buckets, tt.members, tt.maxItems); got != tt.want {
			t.Errorf("genMembers(%d, %d, %d) = %d, want %d", tt.buckets, tt.members, tt.maxItems, got, tt.want)
		}
	}
}

// TestFamilyKeys sorts the keys a scan finds after runs in each shape:
// the current buckets, keyswap's own records, and everything else.
func TestFamilyKeys(t *testing.T) {
	const p = genFamilyKey
	gen := keys.GenPrefix(p, 7)
	all := []string{
		gen + "b000001", gen + "b000002",
		keys.GenBucketKey(p, 6, "b000001"), // the previous generation
		p + ":b000001",                     // the plain shape
		keys.PointerKey(p, false), keys.RegistryKey(p, false), keys.PointerKey(p, true),
		keys.OwnerKey(p, true),       // the owner stamp of the untagged prefix's base on a cluster
		"{other}" + keys.OwnerSuffix, // another base's
		p + ":b000001:rebuild-gen",
		"{rb12}" + p + ":rebuild-n:7",
		keys.LockKey(p, false),
		keys.TempKey(p+":b000003", false, 1700000000, 1),
	}
	buckets, stray := familyKeys(all, p, gen)
	if want := []string{gen + "b000001", gen + "b000002"}; !slices.Equal(buckets, want) {
		t.Errorf("generation 7's buckets: got %q, want %q", buckets, want)
	}
	want := []string{keys.GenBucketKey(p, 6, "b000001"), p + ":b000001", "{other}" + keys.OwnerSuffix, keys.LockKey(p, false), keys.TempKey(p+":b000003", false, 1700000000, 1)}
	if !slices.Equal(stray, want) {
		t.Errorf("generation 7's strays: got %q, want %q", stray, want)
	}

	// In the plain shape, a generation's keys and the pointer start with
	// the data prefix too.
	buckets, stray = familyKeys(all, p, p+":")
	if want := []string{p + ":b000001"}; !slices.Equal(buckets, want) {
		t.Errorf("plain buckets: got %q, want %q", buckets, want)
	}
	if !slices.Contains(stray, gen+"b000001") || !slices.Contains(stray, keys.LockKey(p, false)) || slices.Contains(stray, keys.PointerKey(p, false)) {
		t.Errorf("plain strays: got %q, want generation 7's buckets and the lock, not the pointer", stray)
	}
}

func TestSplitAtPublish(t *testing.T) {
	id := int64(0)
	e := func(cmd string, us int) slowEntry {
		id++
		return slowEntry{ID: id, Command: cmd, Duration: time.Duration(us) * time.Microsecond, Args: 3}
	}
	entries := []slowEntry{e("EXEC", 300), e("EVALSHA heartbeat", 40), e("EVALSHA flip", 0), e("EVAL flip", 60), e("UNLINK", 120), e("SCAN", 90), e("UNLINK", 200)}
	pub, logged, after, longest, own := splitAtPublish(entries, 4)
	if pub != 60*time.Microsecond || !logged {
		t.Errorf("publish: got %v, %v; want 60µs (NOSCRIPT and EVAL added), logged", pub, logged)
	}
	if after.Command != "UNLINK" || after.Longest != 200*time.Microsecond || after.Calls != 2 {
		t.Errorf("after the publish: got %+v, want UNLINK 200µs, 2 calls", after)
	}
	if longest.Command != "EXEC" || longest.Longest != 300*time.Microsecond || own != longest {
		t.Errorf("longest: got %+v, and of keyswap's own %+v; want EXEC 300µs for both", longest, own)
	}
	// A write of the index's data: the longest of all, not keyswap's own.
	data := e("SADD", 900)
	data.Data = true
	if _, _, _, longest, own := splitAtPublish(append(slices.Clone(entries), data), 4); longest.Command != "SADD" || own.Command != "EXEC" || own.Longest != 300*time.Microsecond {
		t.Errorf("with a data write of 900µs: longest %+v, keyswap's own %+v; want SADD, and EXEC 300µs", longest, own)
	}
	// A publish below the threshold: the mark splits the entries.
	unlogged := slices.Concat(entries[:2], entries[4:])
	if pub, logged, after, _, _ := splitAtPublish(unlogged, 2); logged || pub != 0 || after.Command != "UNLINK" || after.Calls != 2 {
		t.Errorf("publish not logged: got %v, %v, after %+v; want 0, not logged, UNLINK twice after", pub, logged, after)
	}
	// Nothing after the mark, nothing logged.
	if _, _, after, _, _ := splitAtPublish(entries, 7); after.Command != "" {
		t.Errorf("nothing after the mark: got %+v", after)
	}
	if _, logged, after, longest, own := splitAtPublish(nil, -1); logged || after.Command != "" || longest.Command != "" || own.Command != "" {
		t.Errorf("no entries: got %v, %+v, %+v; want nothing", logged, after, longest)
	}
}

func TestIsDataWrite(t *testing.T) {
	const p = "ks:family"
	for _, c := range []struct {
		args []string
		want bool
	}{
		{[]string{"SADD", keys.GenBucketKey(p, 7, "b1"), "m"}, true},
		{[]string{"SADD", keys.TempKey(p+":b1", false, 1700000000, 1), "m"}, true},
		{[]string{"HSET", "users", "f", "v"}, true},
		{[]string{"SADD", keys.ManifestKey(p, false, 7), "rebuild-listed"}, false},
		{[]string{"RPUSH", keys.GenBucketKey(p, 7, "b1"), "x"}, false},
		{[]string{"UNLINK", keys.GenBucketKey(p, 7, "b1")}, false},
		{[]string{"SADD"}, false},
	} {
		if got := isDataWrite(c.args[0], c.args); got != c.want {
			t.Errorf("isDataWrite(%q) = %v, want %v", c.args, got, c.want)
		}
	}
}

func TestGenSummarize(t *testing.T) {
	run := func(publish, flip time.Duration, cmd string, longest time.Duration) (genRun, genRun) {
		return genRun{Publish: publish, Longest: commandTime{Command: "EVALSHA publish", Longest: publish}},
			genRun{Publish: flip, Longest: commandTime{Command: cmd, Longest: longest, Calls: 1}}
	}
	sz := genSize{Buckets: 1000}
	for _, x := range []struct {
		publish, flip time.Duration
		cmd           string
		longest       time.Duration
	}{
		{10 * time.Millisecond, 100 * time.Microsecond, "EXEC", 300 * time.Microsecond},
		{8 * time.Millisecond, 200 * time.Microsecond, "UNLINK", 500 * time.Microsecond},
		{30 * time.Millisecond, 100 * time.Microsecond, "", 0}, // none logged
	} {
		rn, gn := run(x.publish, x.flip, x.cmd, x.longest)
		sz.Rename.Runs = append(sz.Rename.Runs, rn)
		sz.Generations.Runs = append(sz.Generations.Runs, gn)
	}
	sz.summarize()
	// Paired by round: 100, 40 and 300.
	if sz.Ratio != 100 || sz.RatioMin != 40 || sz.RatioMax != 300 {
		t.Errorf("ratio %v (%v–%v), want 100 (40–300)", sz.Ratio, sz.RatioMin, sz.RatioMax)
	}
	if s := sz.Rename.Summary; s.Publish != 10*time.Millisecond || s.PerBucket != 10*time.Microsecond || s.PublishMax != 30*time.Millisecond {
		t.Errorf("rename: publish %v, per bucket %v, max %v; want 10ms, 10µs, 30ms", s.Publish, s.PerBucket, s.PublishMax)
	}
	if l := sz.Generations.Summary.Longest; l.Command != "UNLINK" || l.Longest != 300*time.Microsecond || l.Max != 500*time.Microsecond {
		t.Errorf("generations' longest: got %+v, want the median 300µs, the maximum 500µs and its command UNLINK", l)
	}

	// Past -gen-rename-max, no rename runs and no ratio.
	only := genSize{Buckets: 10, Generations: sz.Generations}
	only.summarize()
	if only.Ratio != 0 || only.Rename.Summary.Publish != 0 {
		t.Errorf("without rename runs: ratio %v, rename publish %v; want zeros", only.Ratio, only.Rename.Summary.Publish)
	}
}

func TestGenCPUSummarize(t *testing.T) {
	smp := func(server, client time.Duration) sample {
		return sample{Items: 1000, Elapsed: time.Second, ServerCPU: server, ClientCPU: client}
	}
	g := &genCPU{Methods: []genMethod{{Name: "limit"}, {Name: "raw"}, {Name: "rename"}, {Name: "generations"}}}
	g.summarize(map[string][]sample{
		"limit":       {smp(100, 50), smp(200, 50)},
		"raw":         {smp(100, 100), smp(100, 200)},
		"rename":      {smp(400, 300), smp(400, 400)},
		"generations": {smp(200, 200), smp(300, 200)},
	})
	rn, gn, raw := g.method("rename"), g.method("generations"), g.method("raw")
	if rn.ServerRatio != 3 || rn.ServerRatioMin != 2 || rn.ServerRatioMax != 4 {
		t.Errorf("rename's server CPU / limit's: %v (%v–%v), want 3 (2–4), paired by round", rn.ServerRatio, rn.ServerRatioMin, rn.ServerRatioMax)
	}
	if gn.ClientRatio != 1.5 || gn.ClientRatioMin != 1 || gn.ClientRatioMax != 2 {
		t.Errorf("generations' client CPU / raw's: %v (%v–%v), want 1.5 (1–2)", gn.ClientRatio, gn.ClientRatioMin, gn.ClientRatioMax)
	}
	if raw.ClientRatio != 0 || g.method("limit").ServerRatio != 0 || g.method("none") != nil {
		t.Errorf("raw's ratio to itself %v, the limit's %v: want none", raw.ClientRatio, g.method("limit").ServerRatio)
	}
	if gn.Series.Summary.ServerCPU != 250 || gn.Series.Summary.Ratio != 1 {
		t.Errorf("generations' series: server CPU %v, rate ratio %v; want 250 and 1", gn.Series.Summary.ServerCPU, gn.Series.Summary.Ratio)
	}
}

// TestGenerations runs the generations section alone, small, and checks
// the report's shape and the JSON's, never the numbers, but for those
// that must hold on any machine.
func TestGenerations(t *testing.T) {
	md, rep, path := runSection(t, "-sections", "generations", "-rounds", "1", "-gen-buckets", "100,1000", "-gen-members", "3",
		"-gen-rename-max", "500", "-gen-cpu-buckets", "300", "-gen-cluster-buckets", "300", "-gen-grace", "50ms")
	for _, want := range []string{
		"## Summary", "- Generations mode against rename-in-place, the publish's server time: 100 buckets: flip **", ", rename publish not run (≈ ",
		"## Generations", "| 100 | 3 | 300 |", "| 1,000 | 3 | 3,000 | not run (past -gen-rename-max 500): ≈ ",
		"| 100 | rename | ", "| 100 | generations | ", "| 1,000 | generations | ",
		"### CPU per entry", "| generations | ", "| rename | ", "| raw | ", "| generations, no size check | ",
		"#### Build and removal", "| " + methodPipeUnlink + " | ", "| " + methodPipeDel + " | ", "| generations | LRANGE | ", "| " + methodPipeDel + " | DEL | ",
		"### On a cluster", "| generations, spread over 3 masters | ", "| generations, on one master | ", "| rename, on one master | ",
		"was not rebuilt in rename mode",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "| 1,000 | rename |") {
		t.Errorf("report has a rename run past -gen-rename-max:\n%s", md)
	}
	g := rep.Generations
	if g == nil || len(g.Sizes) != 2 || g.CPU == nil || g.Cluster == nil || len(g.Cluster.Runs) != 3 {
		t.Fatalf("JSON generations: got %+v, want 2 sizes, a CPU part and 3 cluster runs", g)
	}
	for _, sz := range g.Sizes {
		if len(sz.Generations.Runs) != 1 || sz.Generations.Runs[0].Publish <= 0 || sz.Generations.Runs[0].Cleanup <= 50*time.Millisecond {
			t.Errorf("%d buckets: generations runs %+v, want 1 with a flip time, its old generation gone after the grace period", sz.Buckets, sz.Generations.Runs)
		}
	}
	if sz := g.Sizes[0]; len(sz.Rename.Runs) != 1 || sz.Ratio <= 0 {
		t.Errorf("100 buckets: rename runs %+v, ratio %v; want 1 and a ratio", sz.Rename.Runs, sz.Ratio)
	}
	for _, m := range g.CPU.Methods {
		if len(m.Series.Samples) != 1 || m.Series.Samples[0].ServerCPU <= 0 {
			t.Errorf("CPU, %s: samples %+v, want 1 with server CPU", m.Name, m.Series.Samples)
		}
	}
	// The removal of each mode and pipe method is measured apart from the
	// build, and each pipe method deleted with its own command; Generations
	// mode reads the previous generation's manifest (its run's list).
	for name, del := range map[string]string{"generations": "lrange", string(modeGenNoSize): "lrange", methodPipeUnlink: "unlink", methodPipeDel: "del"} {
		m := g.CPU.method(name)
		if m == nil || len(m.Phases) != 1 || m.Phases[0].Build <= 0 || m.Phases[0].Removal <= 0 || m.Phases[0].RemovalCommands[del].Calls == 0 || m.Phase == nil {
			t.Errorf("CPU, %s: phases %+v, want one round with a build, a removal that called %s, and a summary", name, m, del)
		}
	}
	for _, gs := range g.Cluster.Runs {
		if x := gs.Series.Samples; len(x) != 1 || len(x[0].ServerCPU) != clusterMasters || x[0].Elapsed <= 0 {
			t.Errorf("cluster, %s: samples %+v, want 1 with a CPU time per master", gs.Title, x)
		}
	}
	wantRender(t, path, md)
}

func TestRenameEstimate(t *testing.T) {
	withRename := func(buckets int, perBucket time.Duration) genSize {
		return genSize{Buckets: buckets, Rename: genSeries{Runs: []genRun{{}}, Summary: genSummary{PerBucket: perBucket}}}
	}
	sizes := []genSize{withRename(1000, 5*time.Microsecond), withRename(100_000, 20*time.Microsecond), {Buckets: 1_000_000}}
	if est, from := renameEstimate(sizes, 1_000_000); est != 20*time.Second || from != 100_000 {
		t.Errorf("got %v from %d buckets, want 20s from the largest family rebuilt in rename mode, 100,000", est, from)
	}
	if est, from := renameEstimate(sizes[2:], 1_000_000); est != 0 || from != 0 {
		t.Errorf("without rename runs: got %v from %d, want none", est, from)
	}
}
