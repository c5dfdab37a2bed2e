package main

import (
	"context"
	"fmt"
	"time"

	"github.com/keyswap/keyswap/store"
	"github.com/redis/rueidis"
	"github.com/schollz/progressbar/v3"
)

// The values of sweep's -progress flag.
const (
	progressAuto   = "auto"
	progressAlways = "always"
	progressNever  = "never"
)

// progressMinKeys is the keyspace size from which -progress=auto shows a
// bar: a sweep of a smaller keyspace ends before a bar is worth drawing.
const progressMinKeys = 10_000

// sweepProgress draws the sweep's progress on stderr. A nil *sweepProgress
// draws nothing, so callers need not check.
type sweepProgress struct {
	bar    *progressbar.ProgressBar
	dryRun bool
	total  int64 // keys in the keyspace; -1 when unknown
}

// newSweepProgress returns the progress display for a sweep, or nil when
// mode and the surroundings call for none: mode "never"; mode "auto" when
// stderr is not a terminal (a log file would fill with redraws) or the
// keyspace holds fewer than progressMinKeys keys.
//
// The bar fills up to the keyspace size (DBSIZE over every master) as SCAN
// visits keys; when DBSIZE is refused it is a spinner with counts.
func (c *cli) newSweepProgress(ctx context.Context, client rueidis.Client, mode string, dryRun bool) *sweepProgress {
	if mode == progressNever || mode == progressAuto && !c.isTerminal(c.stderr) {
		return nil
	}
	total, err := keyspaceSize(ctx, client)
	if err != nil {
		// DBSIZE may be refused (ACLs); the sweep itself may still work.
		total = -1
	}
	if mode == progressAuto && total < progressMinKeys {
		return nil
	}
	p := &sweepProgress{dryRun: dryRun, total: total}
	p.bar = progressbar.NewOptions64(total, // -1: a spinner
		progressbar.OptionSetWriter(c.stderr),
		progressbar.OptionSetDescription(p.describe(store.SweepProgress{})),
		progressbar.OptionShowCount(),
		progressbar.OptionSpinnerType(14),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
	return p
}

// describe returns the text beside the bar.
func (p *sweepProgress) describe(sp store.SweepProgress) string {
	verb := "deleted"
	if p.dryRun {
		verb = "to delete"
	}
	scope := ""
	if p.total >= 0 {
		scope = fmt.Sprintf(" (keyspace: %d keys)", p.total)
	}
	return fmt.Sprintf("sweep: %s, %d %s%s", plural(sp.Matched, "matching key"), sp.Swept, verb, scope)
}

// update is the sweep's Progress callback.
func (p *sweepProgress) update(sp store.SweepProgress) {
	if p == nil {
		return
	}
	p.bar.Describe(p.describe(sp))
	visited := sp.Visited // an estimate from SCAN's COUNT hint: keep it under the total
	if p.total >= 0 {
		visited = min(visited, p.total)
	}
	_ = p.bar.Set64(visited) // progressbar's errors concern its own state only
}

// finish removes the bar from the terminal.
func (p *sweepProgress) finish() {
	if p == nil {
		return
	}
	_ = p.bar.Finish()
}
