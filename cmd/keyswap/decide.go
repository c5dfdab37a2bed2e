package main

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	krun "github.com/keyswap/keyswap/internal/protocol"
	"github.com/redis/rueidis"
)

// decideHelp is the part of the usage of publish and discard that they
// share.
const decideHelp = `A held rebuild is one that rebuild.Rebuilder.Build stopped short of its
publish (phase "held" in 'keyswap status'); 'keyswap diff' shows what it
would change. <key> is any key of the run (a family's prefix for a family).
The decision is written into the run's record with one script that first
checks the lock still holds the token read with it; the run reads it at its
next heartbeat, about once a second (its Held.Await returns then), and the
first decision wins.

Then the command waits, up to --wait, for the run to end, polling its lock,
and reports the outcome from the keys' generations (their metas,
"<key>:rebuild-gen"): published, with each key's new generation, if they
advanced; discarded otherwise. --wait 0 records the decision and returns at
once.

-json prints one object, with the names exact:

  {
    "server": {"mode": "standalone", "addrs": ["10.0.0.5:6379"], "db": 0},
    "lock_key": "users:by-email:rebuild-lock",
    "token_prefix": "3f9a1c2e",
    "decision": "publish",            or "discard"
    "outcome": "published",           "discarded": ended without publishing;
                                      "recorded": --wait 0
    "keys": [{
      "key": "users:by-email",        a family's prefix for a family
      "family": false,
      "generation": {"gen": 8, "at": "2025-01-02T15:04:05.123Z", "prev": 7,
                     "prev_until": "2025-01-02T16:04:05.123Z", "rolled_back": null}
    }]
  }

"generation" is null for a key never published; "prev" and "prev_until" are
null unless the publish kept the previous generation (Options.KeepPrevious).
A name that is not valid UTF-8 is given instead as the standard base64 of
its bytes, in "lock_key_base64" or "key_base64".

Exit status: 0 when the run ended as decided (or, with --wait 0, once the
decision is recorded); 4 when no rebuild is in progress for <key>; 5 when
it is not held (nothing recorded); 7 when it had not ended within --wait
(the decision stands, and the run acts on it when it reads it); 8 when the
run already published (too late: nothing recorded); 1 on an error, or when
the run ended otherwise: a publish that failed, a run cancelled, or
decided otherwise by its own process first.`

const publishUsage = `Usage: keyswap publish [flags] <key>

Publish decides a held rebuild: the run catches up with the changes applied
while it was held and publishes its keys, all in one atomic step, as an
unheld run does.

` + decideHelp

const discardUsage = `Usage: keyswap discard [flags] <key>

Discard decides a held rebuild: the run deletes its temp keys, releases its
locks and returns an error matching rebuild.ErrDiscarded. The live keys are
left as they are.

` + decideHelp

// defaultWait is how long publish and discard wait for the run to end.
const defaultWait = 30 * time.Second

// pollEvery is how often publish and discard look at the run's lock while
// they wait.
const pollEvery = 50 * time.Millisecond

// errWaitTimeout reports that the run had not ended within --wait: exit
// status exitTimeout.
var errWaitTimeout = errors.New("the run had not ended")

// decideJSON is the -json document of 'keyswap publish' and 'keyswap
// discard'.
type decideJSON struct {
	Server        serverJSON  `json:"server"`
	LockKey       *string     `json:"lock_key,omitempty"`
	LockKeyBase64 []byte      `json:"lock_key_base64,omitempty"`
	TokenPrefix   string      `json:"token_prefix"`
	Decision      string      `json:"decision"`
	Outcome       string      `json:"outcome"`
	Keys          []indexJSON `json:"keys"`
}

// The outcomes of publish and discard.
const (
	outcomePublished = "published"
	outcomeDiscarded = "discarded"
	outcomeRecorded  = "recorded"
)

// publish is the 'keyswap publish' command.
func (c *cli) publish(ctx context.Context, args []string) error {
	return c.decide(ctx, "publish", publishUsage, args)
}

// discard is the 'keyswap discard' command.
func (c *cli) discard(ctx context.Context, args []string) error {
	return c.decide(ctx, "discard", discardUsage, args)
}

// decide records decision, "publish" or "discard", for the held run of
// its argument, and waits for the outcome.
func (c *cli) decide(ctx context.Context, decision, usage string, args []string) error {
	fs := newFlagSet(decision)
	conn := addConnFlags(fs)
	wait := fs.Duration("wait", defaultWait, "how long to wait for the run to end; 0: record the decision and return at once")
	asJSON := fs.Bool("json", false, "print one JSON object (described above) instead of lines")
	positional, err := c.parse(fs, args, usage)
	if err != nil {
		return err
	}
	switch {
	case len(positional) != 1:
		return usagef("want one key, got %s: %q", plural(len(positional), "argument"), positional)
	case *wait < 0:
		return usagef("--wait %v: must not be negative", *wait)
	}
	key := positional[0]
	client, err := c.connect(ctx, conn)
	if err != nil {
		return err
	}
	defer client.Close()
	rr := krun.New(client, nil)
	info, rec, err := findRun(ctx, rr, key)
	if err != nil {
		return err
	}
	if err := requireHeld(decision, key, rec); err != nil {
		return err
	}
	before, err := readGenerations(ctx, client, rec.Keys)
	if err != nil {
		return err
	}
	if err := rr.Operator.Control(ctx, info, requestAction, decision); err != nil {
		if errors.Is(err, krun.ErrTooLate) {
			return fmt.Errorf("%s %s: %w, nothing recorded", decision, displayKey(key), krun.ErrTooLate)
		}
		return err
	}

	outcome := outcomeRecorded
	after := before
	if *wait > 0 {
		switch err := waitEnded(ctx, client, info, *wait); {
		case errors.Is(err, errWaitTimeout):
			return fmt.Errorf("%s %s: %w within --wait %v; the decision stands: the run acts on it when it reads it ('keyswap status' shows it)",
				decision, displayKey(key), err, *wait)
		case err != nil:
			return fmt.Errorf("%s %s: waiting for the run to end (the decision stands): %w", decision, displayKey(key), err)
		}
		if after, err = readGenerations(ctx, client, rec.Keys); err != nil {
			return err
		}
		outcome = outcomeDiscarded
		if advanced(before, after) {
			outcome = outcomePublished
		}
	}
	if err := c.reportDecision(serverOf(client, conn.used), rec, decision, outcome, after, *asJSON); err != nil {
		return err
	}
	switch {
	case decision == "publish" && outcome == outcomeDiscarded:
		return fmt.Errorf("publish %s: the %s ended without publishing: its publish failed, or it was cancelled or discarded first (its process has the error); the live keys are unchanged",
			displayKey(key), rec.describe())
	case decision == "discard" && outcome == outcomePublished:
		return fmt.Errorf("discard %s: the %s was published before it read the decision (by its own process?)", displayKey(key), rec.describe())
	}
	return nil
}

// waitEnded polls the lock of the run info until it no longer holds the
// run's token, for up to wait. It returns an error matching errWaitTimeout
// if it still does then.
func waitEnded(ctx context.Context, client rueidis.Client, info krun.RunInfo, wait time.Duration) error {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		token, err := client.Do(ctx, client.B().Get().Key(info.Lock).Build()).ToString()
		switch {
		case rueidis.IsRedisNil(err), err == nil && token != info.Token:
			return nil
		case err != nil:
			return fmt.Errorf("GET %s: %w", displayKey(info.Lock), err)
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return errWaitTimeout
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// advanced reports whether a publish advanced the first key's generation
// from before to after: every publish advances seq, and a run's publish
// advances all its keys at once. (A rollback moves gen, not seq.)
func advanced(before, after []*generation) bool {
	if len(after) == 0 || after[0] == nil {
		return false
	}
	return before[0] == nil || after[0].Seq > before[0].Seq
}

// reportDecision prints the outcome of a decision on the held run rec, and
// the generations of its keys.
func (c *cli) reportDecision(srv server, rec runRecord, decision, outcome string, gens []*generation, asJSON bool) error {
	idx := make([]keyGeneration, len(rec.Keys))
	for i, k := range rec.Keys {
		idx[i] = keyGeneration{Key: k, Family: rec.Families[i], Generation: gens[i]}
	}
	if asJSON {
		j := decideJSON{Server: srv.json(), TokenPrefix: prefix(rec.Token, tokenPrefixLen), Decision: decision, Outcome: outcome, Keys: indexesJSON(idx)}
		j.LockKey, j.LockKeyBase64 = jsonName(rec.Lock)
		return writeJSON(c.stdout, j)
	}
	switch outcome {
	case outcomeRecorded:
		fmt.Fprintf(c.stdout, "%s requested for the held %s; it acts on it at its next heartbeat, within a second\n", decision, rec.describe())
		return nil
	case outcomeDiscarded:
		fmt.Fprintf(c.stdout, "discarded the held %s: the live keys are unchanged\n", rec.describe())
		return nil
	}
	fmt.Fprintf(c.stdout, "published the held %s\n\n", rec.describe())
	return writeGenerations(c, idx)
}

// writeGenerations prints the indexes idx with their generations.
func writeGenerations(c *cli, idx []keyGeneration) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tFAMILY\tGEN\tLIVE SINCE\tPREV\tPREV KEPT UNTIL")
	for _, g := range idx {
		gen, since, prev, until := g.Generation.columns()
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", displayKey(g.Key), yesNo(g.Family), gen, since, prev, until)
	}
	return tw.Flush()
}
