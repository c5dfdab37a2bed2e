package redistest

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"testing"

	"github.com/redis/rueidis"
)

// ClientAs creates the ACL user name on s (or resets it, if it exists) with a
// fresh random password, and returns a new rueidis client authenticated as
// that user, connected to s only, with client-side caching disabled. The
// user gets ACL SETUSER name reset on >password, then rules, so the rules
// start from a user that may run no command and touch no key or channel:
//
//	c := srv.ClientAs(t, "writer", "~"+redistest.Prefix(t)+"*", "+@all", "-rename")
//
// The client is closed, and the user deleted (ACL DELUSER), when tb's test
// ends, unless the server has been stopped, killed or restarted since. Give
// each test its own user name on a shared server. ClientAs calls tb.Fatal
// when the server rejects the rules or the client cannot connect.
//
// A rueidis client connects as a user with no permission at all ("-@all"):
// its handshake with DisableCache is HELLO 3 AUTH, which Redis lets every user
// run, and CLIENT SETINFO, which redis-server 7.0.15 does not know and which
// rueidis does not check. Once the client has been idle for a second, its
// keep-alive PING fails with NOPERM; rueidis ignores Redis errors from that
// PING and keeps the connection, but ACL LOG records each one: add "+ping"
// to keep them out of the log. ClientAs sets ForceSingleClient. Without it
// rueidis would first send CLUSTER SLOTS, which such a user may not run
// either; it falls back to a single-node client only because the NOPERM
// message names 'cluster|slots'.
func (s *Server) ClientAs(tb testing.TB, name string, rules ...string) rueidis.Client {
	tb.Helper()
	password := rand.Text()
	if err := s.setUser(name, password, rules); err != nil {
		tb.Fatalf("redistest: create ACL user %s on %s: %v", name, s.Addr, err)
	}
	pid := s.PID()
	tb.Cleanup(func() {
		if err := s.deleteUser(name, pid); err != nil {
			tb.Errorf("redistest: delete ACL user %s on %s: %v", name, s.Addr, err)
		}
	})
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{s.Addr},
		Username:          name,
		Password:          password,
		DisableCache:      true,
		ForceSingleClient: true,
	})
	if err != nil {
		tb.Fatalf("redistest: connect to %s as ACL user %s: %v", s.Addr, name, err)
	}
	tb.Cleanup(c.Close)
	return c
}

// setUser runs ACL SETUSER name reset on >password rules... as the default
// user.
func (s *Server) setUser(name, password string, rules []string) error {
	c, err := s.newClient()
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	all := append([]string{"reset", "on", ">" + password}, rules...)
	if err := c.Do(ctx, c.B().AclSetuser().Username(name).Rule(all...).Build()).Error(); err != nil {
		return fmt.Errorf("ACL SETUSER %s reset on >(password) %q: %w", name, rules, err)
	}
	return nil
}

// deleteUser runs ACL DELUSER name, unless the process with ID pid, which
// the user was created on, is gone.
func (s *Server) deleteUser(name string, pid int) error {
	s.mu.Lock()
	same := !s.stopped && s.running() && s.proc.Pid == pid
	s.mu.Unlock()
	if !same {
		return nil // The user went with the process.
	}
	c, err := s.newClient()
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := c.Do(ctx, c.B().AclDeluser().Username(name).Build()).Error(); err != nil {
		return fmt.Errorf("ACL DELUSER %s: %w", name, err)
	}
	return nil
}

// ApplyCommands are the commands a Redis user needs, and no more, so that
// Rebuilder.Apply works, with and without a run in progress, for the
// builders of package builders (the README's Apply user): the apply script
// (EVALSHA, and EVAL when the server's script cache lacks it); GET and
// PTTL on each lock; HMGET and HINCRBY on its record; RPUSH, LLEN and
// PEXPIRE on its log; and the writes of the changes on the index keys,
// with TYPE.
var ApplyCommands = []string{
	"eval", "evalsha",
	"get", "pttl", // the locks
	"hmget", "hincrby", // the records: the run's token, mode and keys; the counts of the log
	"rpush", "llen", "pexpire", // the logs
	"type", "hset", "hdel", "hget", "zadd", "zrem", "zscore", "sadd", "srem", // the index keys
}

// ApplyRules returns the ACL rules, for ClientAs, of the Apply user on the
// keys pattern matches (the index keys, their locks, records and logs),
// without the commands in without.
func ApplyRules(pattern string, without ...string) []string {
	rules := []string{"~" + pattern}
	for _, c := range ApplyCommands {
		if !slices.Contains(without, c) {
			rules = append(rules, "+"+c)
		}
	}
	return rules
}
