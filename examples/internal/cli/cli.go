// Package cli ends the examples' programs the way command-line programs
// end: -h is not an error.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// Main runs run, the program called name, and exits with ExitCode of its
// error, after printing the error on stderr, prefixed with name, when it
// is one.
func Main(name string, run func() error) {
	err := run()
	code := ExitCode(err)
	if code == 1 {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
	}
	os.Exit(code)
}

// ExitCode returns the exit status of a program whose run returned err: 0
// for nil and for flag.ErrHelp (the usage was printed, as -h asked), 2 for
// a bad command line (a *UsageError, already printed), and 1 otherwise.
func ExitCode(err error) int {
	var ue *UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		return 2
	}
	return 1
}

// UsageError is a bad command line, which Parse has printed with the
// usage.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Parse parses args with fs. On -h it prints fs's usage to stdout and
// returns flag.ErrHelp; on a bad flag it prints the error and the usage to
// stderr and returns a *UsageError.
func Parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		return err
	}
	fs.SetOutput(stderr)
	fmt.Fprintln(stderr, err)
	fs.Usage()
	return &UsageError{Err: err}
}
