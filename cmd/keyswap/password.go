package main

import (
	"context"
	"errors"
	"fmt"
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
//  1. --askpass: typed on the terminal;
//  2. the URL's, as given by urlFrom (a flag, $REDIS_URL);
//  3. $KEYSWAP_PASSWORD;
//  4. $REDISCLI_AUTH.
//
// A password in a URL on the command line can be read by every user of the
// machine (ps), so password warns about it on stderr unless
// --no-auth-warning, as redis-cli does.
func (c *cli) password(ctx context.Context, f *connFlags, opt rueidis.ClientOption, urlFrom string) (pw, from string, err error) {
	switch {
	case f.askpass:
		pw, err := c.askPassword(ctx, fmt.Sprintf("user %s at %s", userName(opt), strings.Join(opt.InitAddress, ", ")))
		return pw, "--askpass", err
	case opt.Password != "":
		if strings.HasPrefix(urlFrom, "-") && !f.noAuthWarning {
			fmt.Fprintf(c.stderr, "keyswap: warning: other users of this machine can read the password of a %s URL in the process list;"+
				" set $%s or $%s, or pass --askpass (--no-auth-warning silences this)\n", urlFrom, envPassword, envRedisCLIAuth)
		}
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
// without echo, from stdin, which must be a terminal. When ctx is cancelled
// (Ctrl-C) while it waits, it restores the terminal and returns
// context.Cause(ctx).
func (c *cli) askPassword(ctx context.Context, who string) (string, error) {
	f, ok := c.stdin.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return "", &usageError{err: errors.New("--askpass: stdin is not a terminal to read the password from")}
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
