package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	krun "github.com/keyswap/keyswap/internal/protocol"
)

// Exit codes.
const (
	exitOK       = 0 // success, or help asked for; no sweep candidate found
	exitError    = 1 // a runtime error, including an unreachable Redis or a failed login
	exitUsage    = 2 // a bad command line
	exitOrphans  = 3 // status, or a sweep without --delete, found sweep candidates
	exitNoRun    = 4 // no rebuild in progress for the key a command acts on
	exitConflict = 5 // the run is not held (diff, publish, discard), or one holds the lock (rollback)
	exitNoPrev   = 6 // rollback: no previous generation is kept
	exitTimeout  = 7 // publish, discard: the run had not ended within --wait
	exitTooLate  = 8 // cancel, throttle, pause, resume, publish, discard: the run already published
)

const mainUsage = `keyswap is the operator's tool for keyswap's atomic key rebuilds in Redis:
it shows the rebuilds in progress, steers and decides them, rolls back
what they published, and sweeps the temp keys that crashed processes left
behind and the generations that no reader reads any more.

Usage:

	keyswap <command> [flags] [arguments]

Commands:

	status    list rebuilds in progress, temp keys, and sweep candidates
	cancel    stop a rebuild in progress; it publishes nothing
	throttle  limit the items per second a rebuild in progress pulls
	pause     stop a rebuild in progress from pulling its source
	resume    let a paused rebuild pull its source again
	diff      compare a held rebuild's keys with the live keys
	publish   publish a held rebuild, and wait for its outcome
	discard   discard a held rebuild, and wait for its outcome
	rollback  swap the previous generation of indexes back in
	sweep     delete orphaned temp keys and dead generations (a dry run
	          unless --delete is given)
	version   print keyswap's version (also: keyswap --version)

Run 'keyswap help <command>' (or 'keyswap <command> --help') for a
command's flags. Flags take one dash or two (-json or --json) and may follow
the arguments. Every command takes -json, which prints one JSON object,
errors included.

Every command that talks to Redis takes the same connection flags, named as
redis-cli names them: -u URL (or -redis URL), -h HOST, -p PORT, -s SOCKET,
-n DB, -a PASSWORD (or --pass), --user, --askpass, and --tls with --cacert,
--cert, --key, --insecure and --sni. -h is the host, as in redis-cli: help
is --help. The address defaults to $REDIS_URL, else redis://127.0.0.1:6379.
'keyswap help connect' describes them.

Exit status:

	0  success (and, for status and a dry-run sweep, nothing to sweep)
	1  an error: Redis unreachable, authentication failed, a command failed
	2  a usage error
	3  status or a sweep without --delete found sweep candidates, temp keys
	   or generations (a sweep with --delete exits 0 once it deleted them
	   all)
	4  no rebuild is in progress for the key given (cancel, throttle,
	   pause, resume, diff, publish, discard)
	5  the rebuild is not held (diff, publish, discard), or, for rollback,
	   a rebuild holds the lock; nothing changed
	6  rollback: no previous generation is kept; nothing changed
	7  publish, discard: the run had not ended within --wait (the decision
	   stands)
	8  too late: the run already published (cancel, throttle, pause,
	   resume, publish, discard); nothing changed
`

// command is a subcommand: one file each (status.go, control.go for
// cancel, throttle, pause and resume, diff.go, decide.go for publish and
// discard, rollback.go, sweep.go).
type command struct {
	name string
	// run runs the command with the arguments that follow its name.
	run func(c *cli, ctx context.Context, args []string) error
}

// commands are the subcommands, in the order of mainUsage.
var commands = []command{
	{name: "status", run: (*cli).status},
	{name: "cancel", run: (*cli).cancel},
	{name: "throttle", run: (*cli).throttle},
	{name: "pause", run: (*cli).pause},
	{name: "resume", run: (*cli).resume},
	{name: "diff", run: (*cli).diff},
	{name: "publish", run: (*cli).publish},
	{name: "discard", run: (*cli).discard},
	{name: "rollback", run: (*cli).rollback},
	{name: "sweep", run: (*cli).sweep},
	{name: "version", run: (*cli).version},
}

// cli is what one invocation reads and writes. run fills it from the
// process; tests replace what they need.
type cli struct {
	// stdin is where --askpass reads the password from: it must be a
	// terminal.
	stdin          io.Reader
	stdout, stderr io.Writer
	// now is the clock for temp-key ages and the sweep's cutoff.
	now func() time.Time
	// getenv reads the environment ($REDIS_URL, $KEYSWAP_PASSWORD,
	// $REDISCLI_AUTH).
	getenv func(string) string
	// isTerminal reports whether w is a terminal, for the progress bar.
	isTerminal func(w io.Writer) bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs keyswap with args (without the program name), and returns the
// exit status: one of the exit codes above.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr, now: time.Now, getenv: os.Getenv, isTerminal: isTerminal}
	return c.main(ctx, args)
}

// main dispatches args to a command and turns its error into an exit
// status and a message on stderr.
func (c *cli) main(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(c.stderr, mainUsage)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(rest) == 0 {
			fmt.Fprint(c.stdout, mainUsage)
			return exitOK
		}
		if rest[0] == "connect" {
			c.printConnUsage()
			return exitOK
		}
		// "keyswap help sweep" is "keyswap sweep --help".
		name, rest = rest[0], []string{"--help"}
	case "-version", "--version":
		name = "version"
	}
	for _, cmd := range commands {
		if cmd.name == name {
			return c.exit(cmd.name, cmd.run(c, ctx, rest), wantsJSON(rest))
		}
	}
	names := []string{"connect"}
	for _, cmd := range commands {
		names = append(names, cmd.name)
	}
	err := usagef("unknown command %q%s", name, didYouMean(name, names, ""))
	return c.exit("", err, wantsJSON(rest))
}

// exit reports err, the result of the command called name ("" before
// one is known), and returns the exit status. With -json, the error is
// also printed on stdout as a JSON object (see errorJSON).
func (c *cli) exit(name string, err error, asJSON bool) int {
	var ue *usageError
	code := exitError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return exitOK
	case errors.Is(err, errOrphansFound):
		return exitOrphans
	case errors.As(err, &ue):
		code = exitUsage
		help := "keyswap -h"
		if name != "" {
			help = "keyswap help " + name
			fmt.Fprintf(c.stderr, "keyswap %s: %v\nRun '%s' for usage.\n", name, ue.err, help)
		} else {
			fmt.Fprintf(c.stderr, "keyswap: %v\nRun '%s' for usage.\n", ue.err, help)
		}
	default:
		fmt.Fprintf(c.stderr, "keyswap: %s\n", errorMessage(err))
		switch {
		case errors.Is(err, krun.ErrNoRun):
			code = exitNoRun
		case errors.Is(err, errNotHeld), errors.Is(err, krun.ErrInProgress):
			code = exitConflict
		case errors.Is(err, krun.ErrNothingToRollBack):
			code = exitNoPrev
		case errors.Is(err, errWaitTimeout):
			code = exitTimeout
		case errors.Is(err, krun.ErrTooLate):
			code = exitTooLate
		}
	}
	if asJSON && !errors.Is(err, errReported) {
		msg := errorMessage(err)
		if ue != nil {
			msg = ue.err.Error()
		}
		_ = writeJSON(c.stdout, errorJSON{Command: name, Error: msg, Kind: exitKinds[code], ExitStatus: code}) // stderr has the error
	}
	return code
}

// errorJSON is what a command given -json prints on stdout when it fails,
// besides its message on stderr.
type errorJSON struct {
	Command    string `json:"command"`
	Error      string `json:"error"`
	Kind       string `json:"kind"`
	ExitStatus int    `json:"exit_status"`
	// Time is when a snapshot of 'status --watch' failed; absent
	// otherwise.
	Time *time.Time `json:"time,omitempty"`
}

// exitKinds names the exit statuses of errors, for errorJSON.
var exitKinds = map[int]string{
	exitError:    "error",
	exitUsage:    "usage",
	exitNoRun:    "no_run",
	exitConflict: "conflict",
	exitNoPrev:   "no_previous",
	exitTimeout:  "timeout",
	exitTooLate:  "too_late",
}

// errReported wraps an error whose command printed it in its own -json
// document already (sweep's "error"): exit prints no second document.
var errReported = errors.New("reported in the JSON document")

// wantsJSON reports whether args, a command's arguments, ask for -json.
func wantsJSON(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-json", "--json", "-json=true", "--json=true":
			return true
		}
	}
	return false
}

// didYouMean returns ` (did you mean "x"?)` for the candidate x closest to
// name, with dash in front ("-" for flags), or "" when none is close: at
// most two edits away, and fewer than half of name's letters.
func didYouMean(name string, candidates []string, dash string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(name), c); d < bestDist && d*2 < max(len(name), 2) {
			best, bestDist = c, d
		}
	}
	if best == "" {
		return ""
	}
	if dash != "" {
		return fmt.Sprintf(" (did you mean %s%s?)", dash, best)
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance returns the Levenshtein distance between a and b, counting a
// swap of two neighbours as one edit.
func editDistance(a, b string) int {
	prev2, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// errorMessage returns err's message without the "keyswap: " that the
// library's errors start with (a *store.Error reads "keyswap: sweep: ..."),
// so that exit prints the prefix once.
func errorMessage(err error) string {
	return strings.TrimPrefix(err.Error(), "keyswap: ")
}

// errHelp reports that a command printed its help, as asked: exit status 0.
var errHelp = errors.New("help requested")

// errOrphansFound reports that a command found sweep candidates and
// printed them: exit status 3, and no message.
var errOrphansFound = errors.New("sweep candidates found")

// usageError is a bad command line: exit status 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usagef returns a *usageError with a formatted message.
func usagef(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

// newFlagSet returns a FlagSet for the command called name that reports
// errors instead of printing them or exiting: parse prints what is needed.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("keyswap "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parse parses args with fs and returns the positional arguments. Flags may
// follow positional arguments ("status 'users:*' -json"); a "--" ends the
// flags. On -h it prints usage, then fs's flags, to stdout and returns
// errHelp; on a bad flag it returns a *usageError.
func (c *cli) parse(fs *flag.FlagSet, args []string, usage string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.printUsage(fs, usage)
				return nil, errHelp
			}
			return nil, flagError(fs, err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// flagError turns err, an error of fs.Parse, into a *usageError that says
// what to do: -h without a host is taken for a request for help; an
// unknown flag gets the closest one.
func flagError(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if msg == "flag needs an argument: -h" && fs.Lookup("h") != nil {
		return usagef("-h needs a host, as in redis-cli; for help, pass --help")
	}
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		dash := "-"
		if len(name) > 1 {
			dash = "--"
		}
		return usagef("%s%s", msg, didYouMean(name, names, dash))
	}
	return &usageError{err: err}
}

// printUsage prints usage and then fs's own flags to stdout, and, when it
// takes the connection flags, where they are described.
func (c *cli) printUsage(fs *flag.FlagSet, usage string) {
	conn := connFlagNames()
	fmt.Fprint(c.stdout, strings.TrimRight(usage, "\n")+"\n\nFlags:\n\n")
	printFlags(c.stdout, fs, func(name string) bool { return !conn[name] })
	var takesConn bool
	fs.VisitAll(func(f *flag.Flag) { takesConn = takesConn || conn[f.Name] })
	if takesConn {
		fmt.Fprint(c.stdout, "\nIt takes the connection flags, as redis-cli names them (-u URL, -h HOST, -p PORT,\n"+
			"-s SOCKET, -n DB, -a PASSWORD, --user, --askpass, --tls, ...): see 'keyswap help connect'.\n")
	}
}

// printConnUsage prints the description of the connection flags, and the
// flags: 'keyswap help connect'.
func (c *cli) printConnUsage() {
	fs := newFlagSet("connect")
	addConnFlags(fs)
	fmt.Fprint(c.stdout, connUsage+"\n\nConnection flags:\n\n")
	printFlags(c.stdout, fs, func(string) bool { return true })
}

// printFlags prints the flags of fs for which keep is true to w, in the
// format of flag.PrintDefaults.
func printFlags(w io.Writer, fs *flag.FlagSet, keep func(name string) bool) {
	// A FlagSet of the kept flags only, sharing their values. Var records
	// each value's current setting as its default ("status -json -h" has
	// set -json): restore the real default.
	p := flag.NewFlagSet("", flag.ContinueOnError)
	p.SetOutput(w)
	fs.VisitAll(func(f *flag.Flag) {
		if keep(f.Name) {
			p.Var(f.Value, f.Name, f.Usage)
			p.Lookup(f.Name).DefValue = f.DefValue
		}
	})
	p.PrintDefaults()
}
