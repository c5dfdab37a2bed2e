package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/keyswap/keyswap/internal/scan"
)

// clearScreen moves a terminal's cursor home and clears the screen, so
// that each snapshot of 'status --watch' replaces the last one.
const clearScreen = "\x1b[H\x1b[2J"

// watchStatus prints a snapshot from collect every interval until ctx is
// done (an interrupt), and then returns nil: exit status 0. Tables start
// with a line naming the query and the time, and clear the screen first
// when stdout is a terminal; -json prints each snapshot as one JSON object
// on one line. Each snapshot has snapshotTimeout(interval) to be taken.
// An error of the first snapshot ends the watch (a wrong address, a
// refused login): it is returned. A later error (a failover, a
// server restarting) is shown in place of that snapshot, in JSON as the
// object that -json errors print, with its time, and the watch goes on.
func (c *cli) watchStatus(ctx context.Context, collect func(context.Context) (*statusReport, error),
	interval time.Duration, asJSON bool, q statusQuery) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	tty := !asJSON && c.isTerminal(c.stdout)
	limit := snapshotTimeout(interval)
	for n := 0; ; n++ {
		sctx, cancel := context.WithTimeout(ctx, limit)
		rep, err := collect(sctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (no snapshot within %v; a longer --interval gives each more time)", err, limit)
		}
		if err != nil && n == 0 {
			return err
		}
		var frame bytes.Buffer
		switch {
		case asJSON && err != nil:
			now := c.now().UTC()
			line, _ := json.Marshal(errorJSON{Command: "status", Error: errorMessage(err), Kind: exitKinds[exitError], ExitStatus: exitError, Time: &now})
			frame.Write(append(line, '\n'))
		case asJSON:
			line, err := json.Marshal(rep.json())
			if err != nil {
				return err
			}
			frame.Write(append(line, '\n'))
		default:
			if tty {
				frame.WriteString(clearScreen)
			} else if n > 0 {
				frame.WriteString("\n")
			}
			fmt.Fprintf(&frame, "Every %v: keyswap status %s, until interrupted. %s\n\n", interval, q, c.now().UTC().Format(time.RFC3339))
			if err != nil {
				fmt.Fprintf(&frame, "keyswap: %s\n", errorMessage(err))
			} else if err := writeStatus(&frame, rep); err != nil {
				return err
			}
		}
		if _, err := c.stdout.Write(frame.Bytes()); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// snapshotTimeout is the time a snapshot of 'status --watch' every
// interval may take: five intervals, and at least 5 s. A server that is
// down makes the client retry until then, and the watch must go on and
// say so rather than wait for it.
func snapshotTimeout(interval time.Duration) time.Duration {
	return max(5*time.Second, 5*interval)
}

// String describes q in the header of 'status --watch': "--index K", the
// pattern, or "(every key)".
func (q statusQuery) String() string {
	switch {
	case q.byKey:
		return "--index " + shellQuote(q.key)
	case q.pattern == "":
		return "(every key)"
	}
	return shellQuote(q.pattern)
}

// scanSuggestion returns the command that scans for the temp keys of the
// live key of a status of one key, orphans included: a pattern matching
// that key alone.
func scanSuggestion(key string, conn []string) string {
	cmd := "keyswap status --pattern " + shellQuote(scan.EscapeGlob(key))
	for _, a := range conn {
		cmd += " " + a
	}
	return cmd
}
