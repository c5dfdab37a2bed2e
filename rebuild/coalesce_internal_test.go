package rebuild

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/index"
)

// The coalescer is pure bookkeeping; the runs in pipeline_test.go and
// builders_test.go check what its commands do to Redis.

func entries(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%04d", prefix, i)
	}
	return out
}

// emitted flattens commands into "key name n" lines and the entries per key,
// in order.
func emitted(cmds []mergedCmd) (lines []string, byKey map[string][]string) {
	byKey = map[string][]string{}
	for _, c := range cmds {
		lines = append(lines, fmt.Sprintf("%s %s %d", c.t.Key, c.name, len(c.args)))
		byKey[c.t.Key] = append(byKey[c.t.Key], c.args...)
	}
	return lines, byKey
}

func TestCoalescerFillsCommandsAcrossBatches(t *testing.T) {
	a, b := &target{}, &target{}
	a.Key, b.Key = "a", "b"
	co := &coalescer{bound: 1 << 20}
	var out []mergedCmd
	// 30 batches of 100 entries for a and 1 for b: a's commands fill at
	// index.MaxArgs, b's wait for the drain.
	var wantA []string
	for i := range 30 {
		batch := entries(fmt.Sprintf("a%02d-", i), 100)
		wantA = append(wantA, batch...)
		out = append(out, co.add([]merged{{t: a, name: "SADD", args: batch}, {t: b, name: "SADD", args: []string{fmt.Sprint(i)}}})...)
	}
	if co.total != 30 {
		t.Errorf("held after 30 batches: %d entries, want 30 (b's)", co.total)
	}
	out = append(out, co.drain()...)
	lines, byKey := emitted(out)
	want := []string{"a SADD 1000", "a SADD 1000", "a SADD 1000", "b SADD 30"}
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Errorf("commands (-want +got):\n%s", diff)
	}
	if !slices.Equal(byKey["a"], wantA) {
		t.Errorf("a's entries: got %d, want the %d added, in order", len(byKey["a"]), len(wantA))
	}
	if co.total != 0 || len(co.held) != 0 || a.buf != nil || b.buf != nil {
		t.Errorf("after drain: total %d, %d held, buffers %d and %d entries; want all empty and dropped", co.total, len(co.held), pending(a), pending(b))
	}
}

func TestCoalescerSpillsLargestWhenOverBound(t *testing.T) {
	ts := make([]*target, 5)
	co := &coalescer{bound: 100}
	var ms []merged
	for i := range ts {
		ts[i] = &target{}
		ts[i].Key = fmt.Sprint("k", i)
		// k0 gets 10 entries, k1 20, ..., k4 50: 150 in all, over 100.
		ms = append(ms, merged{t: ts[i], name: "SADD", args: entries("m", 10*(i+1))})
	}
	lines, _ := emitted(co.add(ms))
	// The largest go until at most bound/2 = 50 are held: k4 (50) and k3
	// (40) leave 60, k2 (30) leaves 30.
	if diff := cmp.Diff([]string{"k4 SADD 50", "k3 SADD 40", "k2 SADD 30"}, lines); diff != "" {
		t.Errorf("spilled commands (-want +got):\n%s", diff)
	}
	if co.total != 30 {
		t.Errorf("held after the spill: %d, want 30", co.total)
	}
	lines, _ = emitted(co.drain())
	if diff := cmp.Diff([]string{"k1 SADD 20", "k0 SADD 10"}, lines); diff != "" {
		t.Errorf("drained commands (-want +got):\n%s", diff)
	}
}

func TestCoalescerKeepsCommandsApart(t *testing.T) {
	k := &target{}
	k.Key = "k"
	co := &coalescer{bound: 1 << 20}
	out := co.add([]merged{{t: k, name: "SADD", args: []string{"x", "y"}}, {t: k, name: "PFADD", args: []string{"z"}}})
	out = append(out, co.drain()...)
	lines, _ := emitted(out)
	if diff := cmp.Diff([]string{"k SADD 2", "k PFADD 1"}, lines); diff != "" {
		t.Errorf("commands (-want +got):\n%s", diff)
	}
	if got := out[0].args; !slices.Equal(got, []string{"x", "y"}) {
		t.Errorf("SADD's entries: got %q, want [x y]", got)
	}
}

func TestCoalescerBoundsCommandBytes(t *testing.T) {
	k := &target{}
	k.Key = "k"
	co := &coalescer{bound: 1 << 20}
	big := strings.Repeat("x", maxMergeBytes/2+1)
	// Each entry is over half the byte bound: one per command.
	out := co.add([]merged{{t: k, name: "SADD", args: []string{big, big + "y", "small"}}})
	out = append(out, co.drain()...)
	var sizes []int
	for _, c := range out {
		sizes = append(sizes, len(c.args))
	}
	if !slices.Equal(sizes, []int{1, 2}) {
		t.Errorf("entries per command: got %v, want [1 2]", sizes)
	}
	if out[0].args[0] != big || out[1].args[0] != big+"y" || out[1].args[1] != "small" {
		t.Error("entries changed on their way through the coalescer")
	}
}

func TestCoalescerSendsFullBatchesAsTheyAre(t *testing.T) {
	// A batch that alone fills commands, as a Set's does, goes out in
	// commands of index.MaxArgs without a copy; its rest waits, and so does
	// every entry of a key that already holds some.
	k, held := &target{}, &target{}
	k.Key, held.Key = "k", "held"
	co := &coalescer{bound: 1 << 20}
	co.add([]merged{{t: held, name: "SADD", args: []string{"first"}}})
	batch := entries("m", 2500)
	out := co.add([]merged{{t: k, name: "SADD", args: batch}, {t: held, name: "SADD", args: entries("h", 1500)}})
	lines, _ := emitted(out)
	if diff := cmp.Diff([]string{"k SADD 1000", "k SADD 1000", "held SADD 1000"}, lines); diff != "" {
		t.Errorf("commands (-want +got):\n%s", diff)
	}
	if &out[0].args[0] != &batch[0] || &out[1].args[0] != &batch[1000] {
		t.Error("a full batch's commands were copied, want the batch's own entries")
	}
	if cap(out[0].args) != index.MaxArgs {
		t.Errorf("a full batch's command has capacity %d, want %d: an append to it must not write over the batch", cap(out[0].args), index.MaxArgs)
	}
	if got := out[2].args[0]; got != "first" {
		t.Errorf("the held key's command starts with %q, want what it held first", got)
	}
	if co.total != 500+501 {
		t.Errorf("held: %d entries, want k's 500 and held's 501", co.total)
	}
	rest, byKey := emitted(co.drain()) // the fullest first
	if diff := cmp.Diff([]string{"held SADD 501", "k SADD 500"}, rest); diff != "" {
		t.Errorf("drained commands (-want +got):\n%s", diff)
	}
	if !slices.Equal(byKey["k"], batch[2000:]) {
		t.Error("k's drained entries are not the batch's last 500, in order")
	}
}
