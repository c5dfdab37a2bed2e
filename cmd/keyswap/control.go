package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	krun "github.com/keyswap/keyswap/internal/protocol"
)

// controlHelp is the part of every control command's usage that they share.
const controlHelp = `<key> is any key of the run (a family's prefix for a family): the run is
the one that holds that key's lock. The request is written into the run's
record with one script that first checks the lock still holds the token
read with it, so that it never reaches a later run of the same keys. The
run reads its requests at every heartbeat, about once a second, and
'keyswap status' lists those pending.

-json prints one object instead of a line, with the names exact (a lock
key that is not valid UTF-8 is given as "lock_key_base64"):

  {
    "server": {"mode": "standalone", "addrs": ["10.0.0.5:6379"], "db": 0},
    "command": "throttle",            cancel, throttle, pause or resume
    "lock_key": "users:by-email:rebuild-lock",
    "token_prefix": "3f9a1c2e",
    "field": "max_rate",              the request written into the record
    "value": "100",                   "" clears it
    "recorded": true
  }

Exit status: 0 when the request is recorded; 4 when no rebuild of
rebuild.Rebuilder is in progress for <key> (none holds its lock, or the
lock is held by something that takes no requests, such as
store.WithRebuild); 8 when the run already published: too late, nothing
recorded; 1 on an error; 2 on a usage error.`

const cancelUsage = `Usage: keyswap cancel [flags] <key>

Cancel asks the rebuild in progress of <key> to stop. At its next heartbeat
the run stops pulling its source, deletes its temp keys, releases its locks
and returns an error matching rebuild.ErrAborted. It publishes nothing: the
live keys are left as they are. A held run (rebuild.Rebuilder.Build) is
discarded. A cancel recorded while the run waits for durability, or just
before its publish script, is read by that script, which then publishes
nothing; once the run has published, cancel says it is too late.

` + controlHelp

const throttleUsage = `Usage: keyswap throttle [flags] <key> <items/s>

Throttle limits the rebuild in progress of <key> to at most <items/s> items
per second pulled from its source, from its next heartbeat on. The limit
may be fractional (0.5 is an item every two seconds). 0 removes the limit
set by an earlier throttle: the run goes back to its own, Options.MaxRate,
or to none. 'keyswap status' shows the limit in force (LIMIT).

` + controlHelp

const pauseUsage = `Usage: keyswap pause [flags] <key>

Pause stops the rebuild in progress of <key> from pulling its source, from
its next heartbeat on, until 'keyswap resume <key>'. The run keeps its
lease meanwhile: its locks and temp keys stay alive, its heartbeats go on,
and a paused run does not count as a stalled source.

` + controlHelp

const resumeUsage = `Usage: keyswap resume [flags] <key>

Resume lets a rebuild paused by 'keyswap pause' pull its source again, from
its next heartbeat on.

` + controlHelp

// cancel is the 'keyswap cancel' command.
func (c *cli) cancel(ctx context.Context, args []string) error {
	return c.control(ctx, "cancel", cancelUsage, args, func(rest []string) (fields []string, done string, err error) {
		return []string{requestCancel, "1"}, "it stops at its next heartbeat, within a second, and publishes nothing", nil
	})
}

// throttle is the 'keyswap throttle' command.
func (c *cli) throttle(ctx context.Context, args []string) error {
	return c.control(ctx, "throttle", throttleUsage, args, func(rest []string) ([]string, string, error) {
		if len(rest) != 1 {
			return nil, "", usagef("want a key and a rate in items per second, got %s", plural(len(rest)+1, "argument"))
		}
		rate, err := strconv.ParseFloat(rest[0], 64)
		if err != nil || rate < 0 || math.IsInf(rate, 0) || math.IsNaN(rate) {
			return nil, "", usagef("rate %q: want a number of items per second, 0 or more (0 removes the limit)", rest[0])
		}
		if rate == 0 {
			// "" rather than "0": no request at all, as before any throttle.
			return []string{requestMaxRate, ""}, "from its next heartbeat it runs at its own limit (Options.MaxRate), if any", nil
		}
		v := strconv.FormatFloat(rate, 'f', -1, 64)
		return []string{requestMaxRate, v}, "from its next heartbeat it pulls at most " + v + " items/s", nil
	})
}

// pause is the 'keyswap pause' command.
func (c *cli) pause(ctx context.Context, args []string) error {
	return c.control(ctx, "pause", pauseUsage, args, func(rest []string) ([]string, string, error) {
		return []string{requestPaused, "1"}, "from its next heartbeat it pulls no more items, and keeps its lease, until 'keyswap resume'", nil
	})
}

// resume is the 'keyswap resume' command.
func (c *cli) resume(ctx context.Context, args []string) error {
	return c.control(ctx, "resume", resumeUsage, args, func(rest []string) ([]string, string, error) {
		return []string{requestPaused, ""}, "from its next heartbeat it pulls items again", nil
	})
}

// control runs a command called name that records a request for the run
// holding the lock of its first argument, a key. request turns the other
// arguments into the record's fields, and says what the run will do.
func (c *cli) control(ctx context.Context, name, usage string, args []string,
	request func(rest []string) (fields []string, done string, err error)) error {
	fs := newFlagSet(name)
	conn := addConnFlags(fs)
	asJSON := fs.Bool("json", false, "print one JSON object (described above) instead of a line")
	positional, err := c.parse(fs, args, usage)
	if err != nil {
		return err
	}
	if len(positional) == 0 {
		return usagef("want a key")
	}
	key, rest := positional[0], positional[1:]
	if name != "throttle" && len(rest) > 0 {
		return usagef("want one key, got %s: %q", plural(len(positional), "argument"), positional)
	}
	fields, done, err := request(rest)
	if err != nil {
		return err
	}
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
	if err := rr.Operator.Control(ctx, info, fields...); err != nil {
		if errors.Is(err, krun.ErrTooLate) {
			return fmt.Errorf("%s %s: %w, nothing recorded: the %s publishes what it built", name, displayKey(key), krun.ErrTooLate, rec.describe())
		}
		return err
	}
	if *asJSON {
		j := controlJSON{Server: serverOf(client, conn.used).json(), Command: name, TokenPrefix: prefix(rec.Token, tokenPrefixLen),
			Field: fields[0], Value: fields[1], Recorded: true}
		j.LockKey, j.LockKeyBase64 = jsonName(rec.Lock)
		return writeJSON(c.stdout, j)
	}
	_, err = fmt.Fprintf(c.stdout, "%s requested for the %s; %s\n", name, rec.describe(), done)
	return err
}

// controlJSON is the -json document of cancel, throttle, pause and resume.
type controlJSON struct {
	Server        serverJSON `json:"server"`
	Command       string     `json:"command"`
	LockKey       *string    `json:"lock_key,omitempty"`
	LockKeyBase64 []byte     `json:"lock_key_base64,omitempty"`
	TokenPrefix   string     `json:"token_prefix"`
	Field         string     `json:"field"`
	Value         string     `json:"value"`
	Recorded      bool       `json:"recorded"`
}
