package main

import (
	"strings"
	"testing"
)

// TestOnline runs the online section alone, at its own size, and checks
// the report's shape and the JSON's, never the numbers, but for those
// that must hold on any machine.
func TestOnline(t *testing.T) {
	md, rep, path := runSection(t, "-sections", "online", "-online-n", "3000", "-online-rate", "5000", "-rounds", "2")
	for _, want := range []string{
		"## Summary", "- Online, hash + sorted set + SetIndex at 3,000 items, changes at 5,000/s (",
		"## Online", "**0 lost changes** in 4 runs",
		"| no run in progress |", "| during the rebuild |",
		"| no changes |", "| changes at 5,000/s (",
		"| changes replayed (`Stats.Changes`, per builder) |", "| changes replayed per second of catch-up |", "`PublishTail` = 1,000", "`Options.CatchUpTimeout` (1m0s here)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	for _, unwanted := range []string{"## Throughput", "## Swap pause", "## Scaling", "## Knobs"} {
		if strings.Contains(md, unwanted) {
			t.Errorf("report has %q, which was not selected", unwanted)
		}
	}
	o := rep.Online
	if o == nil || o.Items != 3000 || len(o.Runs) != 2 || len(o.Quiet.Samples) != 2 || len(o.Online.Samples) != 2 {
		t.Fatalf("JSON online: got %+v, want 2 rounds of 3000 items", o)
	}
	for i, rd := range o.Runs {
		if rd.Idle.Calls == 0 || rd.Applied == 0 || rd.Changed == 0 || rd.Ratio <= 0 {
			t.Errorf("round %d: got %+v, want changes with and without a run, and a ratio", i+1, rd)
		}
		if rd.Idle.P50 > rd.Idle.P99 || rd.Idle.P99 > rd.Idle.Max {
			t.Errorf("round %d: idle latency %+v, want p50 ≤ p99 ≤ max", i+1, rd.Idle)
		}
	}

	wantRender(t, path, md)
}

// TestOnlineBacklog runs the online section with a backlog: each round has
// a third run, whose catch-up replays about -online-backlog changes.
func TestOnlineBacklog(t *testing.T) {
	md, rep, path := runSection(t, "-sections", "online", "-online-n", "2000", "-online-rate", "2000", "-online-backlog", "3000", "-rounds", "2")
	for _, want := range []string{
		"### Catch-up of a backlog", "(1,000 Updates, each logging one change for each of the 3 builders)",
		"| changes replayed per second of catch-up |", "| server CPU µs per change |",
		"A catch-up of a backlog of 3,000 changes replays **",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	o := rep.Online
	if o == nil || o.BacklogChanges != 3000 || len(o.Backlog) != 2 {
		t.Fatalf("JSON online: got %+v, want 2 runs with a backlog of 3000", o)
	}
	for i, b := range o.Backlog {
		// Every Update logs a change for each builder; one whose bucket
		// does not change logs none for the SetIndex.
		if b.Applied != 1000 || b.Replayed < 2000 || b.Replayed > 3000 || b.Rate <= 0 || b.ServerCPU <= 0 {
			t.Errorf("run %d with a backlog: got %+v, want 1000 Updates, 2000–3000 changes replayed, a rate and server CPU", i+1, b)
		}
	}
	wantRender(t, path, md)
}

func TestParseOnlineFlags(t *testing.T) {
	wantSizes(t, sectionOnline, config.onlineItems, []sizeCase{
		{nil, 1_000_000},
		{[]string{"-n", "5000"}, 5000},
		{[]string{"-n", "5000", "-online-n", "200"}, 200},
		{[]string{"-online-n", "-1"}, 0},
		{[]string{"-online-backlog", "-1"}, 0},
		{[]string{"-online-rate", "0"}, 0},
		{[]string{"-online-rate", "-10"}, 0},
		{[]string{"-online-rate", "NaN"}, 0},
		{[]string{"-online-rate", "Inf"}, 0},
	})
}
