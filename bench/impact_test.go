package main

import (
	"strings"
	"testing"
	"time"
)

// TestImpact runs the impact section alone, small, and checks the report's
// shape and the JSON's, never the numbers, but for those that must hold on
// any machine.
func TestImpact(t *testing.T) {
	md, rep, path := runSection(t, "-sections", "impact", "-impact-n", "200000", "-impact-budget", "2ms", "-rounds", "1")
	for _, want := range []string{
		"## Summary", "- Impact on other clients, a hash of 200,000 items: a reader's p99 is **",
		"## Impact on other clients", "| no rebuild |", "| unthrottled rebuild |", "| `LatencyBudget` 2ms |", "`BatchSize` 500",
		"During the unthrottled rebuild, the same reader on the Rebuilder's client sees **",
		"### On the Rebuilder's client", "| no rebuild | reader, the Rebuilder's client |", "| unthrottled rebuild | `Apply`, the Rebuilder's client |",
		"| `LatencyBudget` 2ms | reader, a client of its own |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	for _, unwanted := range []string{"## Throughput", "## Online", "## Knobs"} {
		if strings.Contains(md, unwanted) {
			t.Errorf("report has %q, which was not selected", unwanted)
		}
	}
	im := rep.Impact
	if im == nil || im.Items != 200_000 || len(im.Runs) != 1 || len(im.Unthrottled.Samples) != 1 || len(im.Paced.Samples) != 1 || im.Budget != 2*time.Millisecond || im.BatchSize != 500 {
		t.Fatalf("JSON impact: got %+v, want 1 round of 200,000 items, a 2ms budget and BatchSize 500", im)
	}
	rd := im.Runs[0]
	for name, l := range map[string]latency{
		"no rebuild": rd.Idle, "paced": rd.Paced,
		"shared, no rebuild": rd.Shared.Idle, "shared, paced": rd.Shared.Paced,
		"Apply, no rebuild": rd.Apply.Idle, "Apply, paced": rd.Apply.Paced,
	} {
		if l.Calls == 0 || l.P50 > l.P99 || l.P99 > l.Max {
			t.Errorf("%s: latency %+v, want reads with p50 ≤ p99 ≤ max", name, l)
		}
	}
	if s := im.Summary.Apply; s.Ratios.Idle.Median <= 0 || s.P99[condIdle].Median != float64(rd.Apply.Idle.P99) {
		t.Errorf("Apply's summary %+v: want its round's p99, %v, and a positive ratio", s, rd.Apply.Idle.P99)
	}
	if rd.Ratio <= 0 || im.Unthrottled.Summary.Rate <= 0 || im.Paced.Summary.Rate <= 0 {
		t.Errorf("rates %v and %v, ratio %v: want positive", im.Unthrottled.Summary.Rate, im.Paced.Summary.Rate, rd.Ratio)
	}
	wantRender(t, path, md)
}

func TestParseImpactFlags(t *testing.T) {
	wantSizes(t, sectionImpact, config.impactItems, []sizeCase{
		{nil, 2_000_000},
		{[]string{"-n", "5000"}, 10_000},
		{[]string{"-impact-n", "300"}, 300},
		{[]string{"-impact-n", "-1"}, 0},
		{[]string{"-impact-budget", "0"}, 0},
		{[]string{"-impact-batch-size", "-5"}, 0},
	})
}
