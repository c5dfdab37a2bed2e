package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
)

const (
	// probeMargin is how long the PING probe runs before and after the
	// measured command.
	probeMargin = 20 * time.Millisecond
	// probeLimit bounds a probe that nobody stops.
	probeLimit = time.Minute
	// slowlogLen is the slowlog length during the swap section: enough for
	// the probe's PINGs around the measured command.
	slowlogLen = "100000"
)

// swapResult is the swap section: the publish of a rebuilt hash onto a live
// one of the same size, next to a plain RENAME over it.
type swapResult struct {
	Items   int         `json:"items"`
	Publish []pause     `json:"publish"`
	Rename  []pause     `json:"rename"`
	Summary swapSummary `json:"summary"`
}

// pause is how long one command stopped the server.
type pause struct {
	// Server is the command's execution time from SLOWLOG.
	Server time.Duration `json:"server_ns"`
	// Call is the command's round trip as its caller saw it.
	Call time.Duration `json:"call_ns"`
	// WorstPing is the longest round trip of a PING, sent by a probe on
	// its own connection, that overlapped the call.
	WorstPing time.Duration `json:"worst_ping_ns"`
	// Pings is the number of PINGs that overlapped the call.
	Pings int `json:"pings"`
	// IdlePing is the probe's median round trip before the call.
	IdlePing time.Duration `json:"idle_ping_ns"`
}

// swapSummary holds medians and maxima over rounds.
type swapSummary struct {
	PublishServer    time.Duration `json:"publish_server_ns_median"`
	PublishServerMax time.Duration `json:"publish_server_ns_max"`
	PublishPing      time.Duration `json:"publish_worst_ping_ns_median"`
	PublishPingMax   time.Duration `json:"publish_worst_ping_ns_max"`
	RenameServer     time.Duration `json:"rename_server_ns_median"`
	RenameServerMax  time.Duration `json:"rename_server_ns_max"`
	RenamePing       time.Duration `json:"rename_worst_ping_ns_median"`
	RenamePingMax    time.Duration `json:"rename_worst_ping_ns_max"`
	IdlePing         time.Duration `json:"idle_ping_ns_median"`
}

// swap runs the swap section.
func (r *runner) swap(ctx context.Context) (_ *swapResult, err error) {
	s := r.srv
	// Log every command: the probe's PINGs too, hence a long log.
	restore, err := r.slowlogAll(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if rerr := restore(); err == nil {
			err = rerr
		}
	}()
	w := hashWorkload()
	live := w.targets[0].key
	d := newDataset(r.cfg.n, 1)
	// A small rebuild first loads the publish script into the server's
	// script cache, so that the measured publish is one EVALSHA, as in
	// steady state, not NOSCRIPT followed by EVAL.
	if err := s.reset(ctx); err != nil {
		return nil, err
	}
	rb, err := rebuilder(s.client, w, rebuild.Options{})
	if err != nil {
		return nil, err
	}
	if err := runKeyswap(ctx, rb, w, newDataset(1, 1)); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}

	res := &swapResult{Items: d.n}
	for round := range r.cfg.rounds {
		r.bar.describe("swap %d/%d: keyswap publish onto %d fields", round+1, r.cfg.rounds, d.n)
		p, err := r.publishPause(ctx, w, d, live)
		if err != nil {
			return nil, fmt.Errorf("publish: %w", err)
		}
		res.Publish = append(res.Publish, p)
		r.bar.step()

		r.bar.describe("swap %d/%d: RENAME over %d fields", round+1, r.cfg.rounds, d.n)
		if p, err = r.renamePause(ctx, w, d, live); err != nil {
			return nil, fmt.Errorf("RENAME: %w", err)
		}
		res.Rename = append(res.Rename, p)
		r.bar.step()
	}
	res.summarize()
	return res, nil
}

func (res *swapResult) summarize() {
	get := func(ps []pause, f func(pause) time.Duration) (med, worst time.Duration) {
		var ds []time.Duration
		for _, p := range ps {
			ds = append(ds, f(p))
		}
		return medianDuration(ds), slices.Max(ds)
	}
	server := func(p pause) time.Duration { return p.Server }
	ping := func(p pause) time.Duration { return p.WorstPing }
	s := &res.Summary
	s.PublishServer, s.PublishServerMax = get(res.Publish, server)
	s.PublishPing, s.PublishPingMax = get(res.Publish, ping)
	s.RenameServer, s.RenameServerMax = get(res.Rename, server)
	s.RenamePing, s.RenamePingMax = get(res.Rename, ping)
	s.IdlePing, _ = get(append(slices.Clone(res.Publish), res.Rename...), func(p pause) time.Duration { return p.IdlePing })
}

// slowlogAll makes the server log every command, and returns the function
// that restores its settings.
func (r *runner) slowlogAll(ctx context.Context) (func() error, error) {
	restore, err := r.saveSlowlog(ctx)
	if err != nil {
		return nil, err
	}
	for _, kv := range [][2]string{{"slowlog-log-slower-than", "0"}, {"slowlog-max-len", slowlogLen}} {
		if err := r.srv.configSet(ctx, kv[0], kv[1]); err != nil {
			return nil, errors.Join(err, restore())
		}
	}
	return restore, nil
}

// saveSlowlog returns the function that restores the server's slowlog
// settings as they are now, and empties the slowlog.
func (r *runner) saveSlowlog(ctx context.Context) (func() error, error) {
	s := r.srv
	var saved [][2]string
	for _, name := range []string{"slowlog-log-slower-than", "slowlog-max-len"} {
		old, err := s.configGet(ctx, name)
		if err != nil {
			return nil, err
		}
		saved = append(saved, [2]string{name, old})
	}
	return func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		var errs []error
		for _, kv := range saved {
			errs = append(errs, s.configSet(ctx, kv[0], kv[1]))
		}
		errs = append(errs, s.admin.Do(ctx, s.admin.B().SlowlogReset().Build()).Error())
		return errors.Join(errs...)
	}, nil
}

// publishPause runs a keyswap rebuild of d onto a live hash of as many
// fields, and measures its publish.
func (r *runner) publishPause(ctx context.Context, w workload, d dataset, live string) (pause, error) {
	s := r.srv
	if err := s.reset(ctx); err != nil {
		return pause{}, err
	}
	if err := preload(ctx, s.client, w, d); err != nil {
		return pause{}, err
	}
	if err := s.settle(ctx); err != nil {
		return pause{}, err
	}
	var p pause
	var perr error
	calls := 0
	hooked := &publishHook{Client: s.client, around: func(_ []string, do func()) {
		calls++
		p, perr = r.measurePause(ctx, do, func(args []string) bool {
			return (strings.EqualFold(args[0], "EVALSHA") || strings.EqualFold(args[0], "EVAL")) && slices.Contains(args, live)
		})
	}}
	rb, err := rebuilder(hooked, w, r.cfg.keyswap)
	if err != nil {
		return pause{}, err
	}
	if err := runKeyswap(ctx, rb, w, d); err != nil {
		return pause{}, err
	}
	switch {
	case perr != nil:
		return pause{}, perr
	case calls != 1:
		return pause{}, fmt.Errorf("the publish script ran %d times, want once", calls)
	}
	if err := w.verify(ctx, s.admin, d); err != nil {
		return pause{}, fmt.Errorf("wrong result: %w", err)
	}
	return p, nil
}

// renamePause measures RENAME of a temp hash of d over a live hash of as
// many fields.
func (r *runner) renamePause(ctx context.Context, w workload, d dataset, live string) (pause, error) {
	s := r.srv
	temp := live + ":renamed"
	tw := workload{name: w.name, targets: []target{{kindHash, temp}}}
	if err := s.reset(ctx); err != nil {
		return pause{}, err
	}
	if err := preload(ctx, s.client, w, d); err != nil {
		return pause{}, err
	}
	if err := pipeline(ctx, s.client, tw, d, perCommand, rebuild.Defaults().Writers); err != nil {
		return pause{}, err
	}
	if err := s.settle(ctx); err != nil {
		return pause{}, err
	}
	var rerr error
	p, err := r.measurePause(ctx, func() {
		rerr = s.client.Do(ctx, s.client.B().Rename().Key(temp).Newkey(live).Build()).Error()
	}, func(args []string) bool { return strings.EqualFold(args[0], "RENAME") })
	if err == nil {
		err = rerr
	}
	if err != nil {
		return pause{}, err
	}
	if err := w.verify(ctx, s.admin, d); err != nil {
		return pause{}, fmt.Errorf("wrong result: %w", err)
	}
	return p, nil
}

// measurePause runs do with a PING probe around it, and returns its pause.
// match picks the command's SLOWLOG entries by their arguments.
func (r *runner) measurePause(ctx context.Context, do func(), match func(args []string) bool) (pause, error) {
	s := r.srv
	pr, err := startProbe(ctx, s.addr)
	if err != nil {
		return pause{}, err
	}
	time.Sleep(probeMargin) // Idle round trips, for reference.
	if err := s.admin.Do(ctx, s.admin.B().SlowlogReset().Build()).Error(); err != nil {
		pr.stop()
		return pause{}, fmt.Errorf("SLOWLOG RESET: %w", err)
	}
	start := time.Now()
	do()
	end := time.Now()
	time.Sleep(probeMargin)
	pings, err := pr.stop()
	if err != nil {
		return pause{}, fmt.Errorf("PING probe: %w", err)
	}
	p := pause{Call: end.Sub(start)}
	var idle []time.Duration
	for _, pg := range pings {
		switch {
		case pg.sent.Add(pg.rtt).Before(start):
			idle = append(idle, pg.rtt)
		case pg.sent.After(end):
		default:
			p.Pings++
			p.WorstPing = max(p.WorstPing, pg.rtt)
		}
	}
	p.IdlePing = medianDuration(idle)
	if p.Server, err = slowlogTime(ctx, s.admin, match); err != nil {
		return pause{}, err
	}
	return p, nil
}

// slowlogTime returns the total execution time of the SLOWLOG entries
// whose arguments match. SLOWLOG entries are [id, unix time, duration in
// µs, [args...], ...].
func slowlogTime(ctx context.Context, c rueidis.Client, match func([]string) bool) (time.Duration, error) {
	entries, err := c.Do(ctx, c.B().SlowlogGet().Count(-1).Build()).ToArray()
	if err != nil {
		return 0, fmt.Errorf("SLOWLOG GET: %w", err)
	}
	var total time.Duration
	found := 0
	for _, e := range entries {
		_, d, args, _, _, err := parseSlowlogEntry(e)
		if err != nil {
			return 0, err
		}
		if !match(args) {
			continue
		}
		total += d
		found++
	}
	if found == 0 {
		return 0, errors.New("the measured command is not in SLOWLOG")
	}
	return total, nil
}

// publishScript is keyswap's publish script, which publishHook recognises.
var publishScript = redistest.ScriptNamed("publish")

// publishHook is the client a Rebuilder writes through in the swap and
// publish sections: it passes every command on, and runs the publish
// script (EVALSHA, or the EVAL fallback) inside around, which gets its
// arguments.
type publishHook struct {
	rueidis.Client
	around func(args []string, do func())
}

// Do runs cmd, inside around when it is the publish script.
func (h *publishHook) Do(ctx context.Context, cmd rueidis.Completed) (res rueidis.RedisResult) {
	if args := cmd.Commands(); publishScript.Is(args) {
		h.around(args, func() { res = h.Client.Do(ctx, cmd) })
		return res
	}
	return h.Client.Do(ctx, cmd)
}

// ping is one PING of the probe.
type ping struct {
	sent time.Time
	rtt  time.Duration
}

// probe sends PING after PING on its own connection, one at a time, and
// records each round trip.
type probe struct {
	conn  net.Conn
	pings []ping
	err   error
	done  chan struct{}
	quit  chan struct{}
	once  sync.Once
}

// startProbe connects to addr and starts pinging. It stops by itself after
// probeLimit.
func startProbe(ctx context.Context, addr string) (*probe, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &probe{conn: conn, done: make(chan struct{}), quit: make(chan struct{})}
	go p.loop()
	return p, nil
}

func (p *probe) loop() {
	defer close(p.done)
	r := bufio.NewReader(p.conn)
	reply := make([]byte, len("+PONG\r\n"))
	deadline := time.Now().Add(probeLimit)
	for {
		select {
		case <-p.quit:
			return
		default:
		}
		sent := time.Now()
		if sent.After(deadline) {
			p.err = fmt.Errorf("not stopped within %v", probeLimit)
			return
		}
		if err := p.conn.SetDeadline(sent.Add(probeLimit)); err != nil {
			p.err = err
			return
		}
		if _, err := io.WriteString(p.conn, "PING\r\n"); err != nil {
			p.err = err
			return
		}
		if _, err := io.ReadFull(r, reply); err != nil {
			p.err = err
			return
		}
		if string(reply) != "+PONG\r\n" {
			p.err = fmt.Errorf("PING answered %q", reply)
			return
		}
		p.pings = append(p.pings, ping{sent: sent, rtt: time.Since(sent)})
	}
}

// stop ends the probe and returns its pings.
func (p *probe) stop() ([]ping, error) {
	p.once.Do(func() { close(p.quit) })
	<-p.done
	p.conn.Close()
	return p.pings, p.err
}
