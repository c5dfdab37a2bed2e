package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"syscall"
	"testing"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
)

func TestCutAllFailsInFlightCommands(t *testing.T) {
	t.Parallel()
	p := newProxy(t, env.Standalone.Addr)
	c := newClient(t, p.Addr())
	direct := env.Standalone.Client(t)
	key := redistest.Prefix(t) + "k"
	set(t, c, key, "old")

	t.Run("Do", func(t *testing.T) {
		// Hold the command in the proxy, so that it is in flight for sure.
		p.Pause()
		before := p.Stats().Held
		done := async(func() error { return c.Do(t.Context(), c.B().Set().Key(key).Value("new").Build()).Error() })
		waitHeld(t, p, before+1)
		p.CutAll()
		p.Resume()
		if err := <-done; !isCutErr(err) {
			t.Fatalf("SET cut in flight: got %v, want a reset or EOF", err)
		}
		// The held bytes were dropped: the server never saw the SET.
		if got := get(t, direct, key); got != "old" {
			t.Fatalf("value after the cut: got %q, want old", got)
		}
		// rueidis dials a new connection for the next command.
		set(t, c, key, "again")
		if got := get(t, c, key); got != "again" {
			t.Fatalf("GET after reconnecting: got %q, want again", got)
		}
	})
	t.Run("DoMulti", func(t *testing.T) {
		p.Pause()
		before := p.Stats().Held
		done := async(func() []rueidis.RedisResult {
			return c.DoMulti(t.Context(),
				c.B().Set().Key(key).Value("multi").Build(),
				c.B().Get().Key(key).Build(),
				c.B().Incr().Key(key+":n").Build())
		})
		waitHeld(t, p, before+1)
		p.CutAll()
		p.Resume()
		// Every result carries the connection's error, the read-only
		// GET included: rueidis retries a DoMulti only when all of its
		// commands are read-only.
		for i, r := range <-done {
			if err := r.Error(); !isCutErr(err) {
				t.Errorf("DoMulti result %d: got %v, want a reset or EOF", i, err)
			}
		}
	})
	t.Run("read-only commands are retried", func(t *testing.T) {
		p.Pause()
		before := p.Stats().Held
		done := async(func() rueidis.RedisResult { return c.Do(t.Context(), c.B().Get().Key(key).Build()) })
		waitHeld(t, p, before+1)
		cut := p.Stats().Cut
		p.CutAll()
		eventually(t, "the connection is cut", func() error {
			if got := p.Stats().Cut; got == cut {
				return fmt.Errorf("Stats.Cut: got %d, want more than %d", got, cut)
			}
			return nil
		})
		p.Resume()
		if got, err := (<-done).ToString(); err != nil || got != "again" {
			t.Fatalf("GET cut in flight: got %q, %v, want again from a silent retry", got, err)
		}
	})
}

// isCutErr reports whether err is what rueidis returns for a connection that
// was cut: the reset itself, or, when another goroutine of the pipe saw the
// reset first, the EOF or broken pipe that follow it.
func isCutErr(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE)
}

// respSize returns the size of cmd in RESP, as rueidis writes it.
func respSize(cmd rueidis.Completed) int64 {
	args := cmd.Commands()
	n := int64(len("*" + strconv.Itoa(len(args)) + "\r\n"))
	for _, a := range args {
		n += int64(len("$"+strconv.Itoa(len(a))+"\r\n") + len(a) + len("\r\n"))
	}
	return n
}

func TestCutAfterToServerFailsALargeWritePartway(t *testing.T) {
	t.Parallel()
	p := newProxy(t, env.Standalone.Addr)
	c := newClient(t, p.Addr())
	direct := env.Standalone.Client(t)
	prefix := redistest.Prefix(t)

	// 50 HSETs of 1000 fields each, about 1.8 MB, in one DoMulti.
	// rueidis recycles the commands it has sent, so build them anew for
	// each call.
	const commands, fields = 50, 1000
	build := func() rueidis.Commands {
		cmds := make(rueidis.Commands, commands)
		for i := range cmds {
			b := c.B().Hset().Key(prefix + "h" + strconv.Itoa(i)).FieldValue()
			for j := range fields {
				b = b.FieldValue("field"+strconv.Itoa(j), "value-of-twenty-bytes")
			}
			cmds[i] = b.Build()
		}
		return cmds
	}
	cmds := build()
	// Cut in the middle of the 21st command.
	for i := range commands {
		direct.Do(t.Context(), direct.B().Del().Key(prefix+"h"+strconv.Itoa(i)).Build()) // left by -count > 1
	}
	var budget, whole int64
	for i := range 20 {
		budget += respSize(cmds[i])
		whole++
	}
	budget += respSize(cmds[20]) / 2

	before := p.Stats()
	p.CutAfter(ToServer, budget)
	// Replies that reach the client before the cut succeed; every later
	// result fails, even those of commands that the server ran.
	results := c.DoMulti(t.Context(), cmds...)
	var replied int64
	for replied < int64(len(results)) && results[replied].Error() == nil {
		replied++
	}
	if replied > whole {
		t.Errorf("DoMulti: got %d replies, want at most the %d whole commands", replied, whole)
	}
	for i, r := range results[replied:] {
		if err := r.Error(); !isCutErr(err) {
			t.Errorf("DoMulti result %d: got %v, want a reset or EOF", replied+int64(i), err)
		}
	}
	after := p.Stats()
	if got := after.ToServer - before.ToServer; got != budget {
		t.Errorf("bytes delivered to the server: got %d, want exactly %d", got, budget)
	}
	if got := after.Cut - before.Cut; got < 1 {
		t.Errorf("connections cut: got %d, want at least 1", got)
	}
	// The server ran the whole commands and dropped the partial one.
	waitClosed(t, p)
	var written int64
	for i := range commands {
		n, err := direct.Do(t.Context(), direct.B().Hlen().Key(prefix+"h"+strconv.Itoa(i)).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 && n != fields {
			t.Errorf("HLEN of hash %d: got %d, want 0 or %d", i, n, fields)
		}
		if n == fields {
			written++
		}
	}
	if written != whole {
		t.Errorf("hashes written: got %d, want the %d whole commands within the budget", written, whole)
	}

	// The trip is one-shot: the next write goes through whole.
	for i, r := range c.DoMulti(t.Context(), build()...) {
		if err := r.Error(); err != nil {
			t.Fatalf("DoMulti after the cut, result %d: %v", i, err)
		}
	}
}

func TestCutAfterToClientLosesTheReply(t *testing.T) {
	t.Parallel()
	p := newProxy(t, env.Standalone.Addr)
	c := newClient(t, p.Addr())
	direct := env.Standalone.Client(t)
	key := redistest.Prefix(t) + "n"
	direct.Do(t.Context(), direct.B().Del().Key(key).Build()) // left by -count > 1

	before := p.Stats()
	p.CutAfter(ToClient, 0)
	if err := c.Do(t.Context(), c.B().Incr().Key(key).Build()).Error(); !isCutErr(err) {
		t.Fatalf("INCR: got %v, want a reset or EOF", err)
	}
	if got := p.Stats().ToClient - before.ToClient; got != 0 {
		t.Errorf("bytes delivered to the client: got %d, want 0", got)
	}
	// The server ran it all the same.
	waitClosed(t, p)
	if got := get(t, direct, key); got != "1" {
		t.Fatalf("value after the lost reply: got %q, want 1", got)
	}

	// A retryable script is run again on a new connection, so it runs
	// twice: the reason only idempotent scripts may be retryable. Run it
	// once first, so that the lost reply is not a NOSCRIPT error.
	incr := rueidis.NewLuaScriptRetryable("return redis.call('INCR', KEYS[1])")
	if got, err := incr.Exec(t.Context(), c, []string{key}, nil).AsInt64(); err != nil || got != 2 {
		t.Fatalf("retryable script: got %d, %v, want 2", got, err)
	}
	p.CutAfter(ToClient, 0)
	got, err := incr.Exec(t.Context(), c, []string{key}, nil).AsInt64()
	if err != nil || got != 4 {
		t.Fatalf("retryable script after a lost reply: got %d, %v, want 4 (run twice, no error)", got, err)
	}
}

func TestCutAfterDisarmed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		disarm func(p *Proxy)
	}{
		{"CutAfter -1", func(p *Proxy) { p.CutAfter(ToServer, -1) }},
		{"Heal", (*Proxy).Heal},
		{"other direction", func(p *Proxy) { p.CutAfter(ToServer, -1); p.CutAfter(ToClient, 1<<20) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newProxy(t, env.Standalone.Addr)
			c := newClient(t, p.Addr())
			p.CutAfter(ToServer, 0)
			tc.disarm(p)
			set(t, c, redistest.Prefix(t)+"k", "v")
			if st := p.Stats(); st.Cut != 0 {
				t.Errorf("Stats.Cut: got %d, want 0", st.Cut)
			}
		})
	}
}

func TestRefuse(t *testing.T) {
	t.Parallel()
	p := newProxy(t, env.Standalone.Addr)
	c := newClient(t, p.Addr())
	key := redistest.Prefix(t) + "k"
	set(t, c, key, "v")

	// Server "down": open connections cut, new ones reset. A SET fails on
	// the cut connection until rueidis notices the cut, then on refused
	// connections.
	p.Refuse(true)
	p.CutAll()
	for range 2 {
		err := c.Do(t.Context(), c.B().Set().Key(key).Value("w").Build()).Error()
		if !isCutErr(err) {
			t.Fatalf("SET while refused: got %v, want a reset or EOF", err)
		}
	}
	if st := p.Stats(); st.Refused < 1 {
		t.Errorf("Stats.Refused: got %d, want at least 1", st.Refused)
	}
	p.Refuse(false)
	set(t, c, key, "w")
	if got := get(t, c, key); got != "w" {
		t.Fatalf("GET after Refuse(false): got %q, want w", got)
	}
}
