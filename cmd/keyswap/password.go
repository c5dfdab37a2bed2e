package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/redis/rueidis"
	"golang.org/x/term"
)

// The environment variables a password may come from, in order of
// precedence: keyswap's own, then redis-cli's.
const (
	envPassword     = "KEYSWAP_PASSWORD"
	envRedisCLIAuth = "REDISCLI_AUTH"
)

// password returns the password to log in to opt with, and where it came
// from ("" for none). The first of these wins:
//
//  1. --askpass: typed on the terminal, or the first line of stdin;
//  2. -a or --pass;
//  3. the URL's, as given by urlFrom (a flag, $REDIS_URL);
//  4. $KEYSWAP_PASSWORD;
//  5. $REDISCLI_AUTH.
//
// A password on the command line (-a, --pass, a -u URL) can be read by
// every user of the machine (ps), so password warns about it on stderr
// unless --no-auth-warning, as redis-cli does.
func (c *cli) password(ctx context.Context, f *connFlags, opt rueidis.ClientOption, urlFrom string) (pw, from string, err error) {
	// The process list shows a password given on the command line, used or
	// not (--askpass wins).
	if !f.noAuthWarning {
		switch {
		case f.password != "":
			fmt.Fprintf(c.stderr, "keyswap: warning: other users of this machine can read a password given with %s in the process list;"+
				" set $%s or $%s, or pass --askpass (--no-auth-warning silences this)\n", f.passwordFlag, envPassword, envRedisCLIAuth)
		case opt.Password != "" && strings.HasPrefix(urlFrom, "-"):
			fmt.Fprintf(c.stderr, "keyswap: warning: other users of this machine can read the password of a %s URL in the process list;"+
				" set $%s or $%s, or pass --askpass (--no-auth-warning silences this)\n", urlFrom, envPassword, envRedisCLIAuth)
		}
	}
	switch {
	case f.askpass:
		pw, err := c.askPassword(ctx, fmt.Sprintf("user %s at %s", userName(opt), strings.Join(opt.InitAddress, ", ")))
		return pw, "--askpass", err
	case f.password != "":
		return f.password, f.passwordFlag, nil
	case opt.Password != "":
		return opt.Password, "the " + urlFrom + " URL", nil
	}
	for _, name := range []string{envPassword, envRedisCLIAuth} {
		if pw := c.getenv(name); pw != "" {
			return pw, "$" + name, nil
		}
	}
	return "", "", nil
}

// userName returns the ACL user that opt logs in as.
func userName(opt rueidis.ClientOption) string {
	if opt.Username == "" {
		return "default"
	}
	return opt.Username
}

// passwordHint says, for a refused login, where the password came from.
func passwordHint(from string) string {
	if from == "" {
		return fmt.Sprintf("no password was given: put it in the URL, set $%s or $%s, or pass --askpass", envPassword, envRedisCLIAuth)
	}
	return "the password came from " + from
}

// askPassword prompts for the password of who on stderr and reads it,
// without echo, from stdin when it is a terminal. When ctx is cancelled
// (Ctrl-C) while it waits, it restores the terminal and returns
// context.Cause(ctx). When stdin is not a terminal (a pipe, a file), it
// reads the first line of stdin instead, without a prompt, as redis-cli
// does.
func (c *cli) askPassword(ctx context.Context, who string) (string, error) {
	f, ok := c.stdin.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return readPasswordLine(c.stdin)
	}
	fd := int(f.Fd())
	state, err := term.GetState(fd)
	if err != nil {
		return "", fmt.Errorf("--askpass: %w", err)
	}
	fmt.Fprintf(c.stderr, "Password for %s: ", who)
	type line struct {
		pw  []byte
		err error
	}
	read := make(chan line, 1)
	go func() {
		pw, err := term.ReadPassword(fd)
		read <- line{pw, err}
	}()
	select {
	case l := <-read:
		fmt.Fprintln(c.stderr)
		if l.err != nil {
			return "", fmt.Errorf("--askpass: %w", l.err)
		}
		return string(l.pw), nil
	case <-ctx.Done():
		// ReadPassword turns echo back on only when a line ends, and the
		// process exits before then: turn it on here. The goroutine stays
		// blocked in its read until the process exits.
		_ = term.Restore(fd, state) // best effort: the error being returned matters more
		fmt.Fprintln(c.stderr)
		return "", fmt.Errorf("--askpass: %w", context.Cause(ctx))
	}
}

// readPasswordLine returns the first line of r, without its line ending:
// the password that --askpass reads from a pipe.
func readPasswordLine(r io.Reader) (string, error) {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("--askpass: reading stdin: %w", err)
	}
	if line == "" {
		return "", &usageError{err: errors.New("--askpass: stdin is not a terminal, and holds no line to read the password from")}
	}
	return strings.TrimRight(line, "\r\n"), nil
}
