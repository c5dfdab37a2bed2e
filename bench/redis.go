package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
	"golang.org/x/sys/unix"
)

// settleTimeout bounds the wait for the server's background frees
// (lazyfree_pending_objects) between runs.
const settleTimeout = 2 * time.Minute

// server is the Redis the bench runs against: its own redis-server, or the
// one -addr names.
type server struct {
	addr    string
	host    string
	port    string
	version string
	// own is the redis-server the bench started, nil with -addr. Only an
	// own server is ever flushed.
	own *redistest.Server
	// client carries the methods' writes; admin everything else (INFO,
	// cleanup, verification), on its own connection.
	client, admin rueidis.Client
}

// openServer starts a redis-server on a free loopback port, pinned to cpu
// unless it is negative, or connects to addr when it is not empty.
//
// redistest.StartServer is reused rather than copied: it picks a free port,
// retries on a port race, checks that the PONG comes from its own process,
// and kills the server if the bench dies. It needs no testing.TB.
func openServer(ctx context.Context, addr string, cpu int) (*server, error) {
	s := &server{addr: addr}
	if addr == "" {
		own, err := redistest.StartServer()
		if err != nil {
			return nil, err
		}
		s.own, s.addr = own, own.Addr
		if cpu >= 0 {
			if err := pin(own.PID(), cpu); err != nil {
				s.close()
				return nil, err
			}
		}
	}
	if err := s.connect(ctx); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// connect opens the clients of s and reads its version.
func (s *server) connect(ctx context.Context) error {
	var err error
	if s.host, s.port, err = net.SplitHostPort(s.addr); err != nil {
		return fmt.Errorf("-addr %q: %w", s.addr, err)
	}
	if s.client, err = s.newClient(benchClientName); err == nil {
		s.admin, err = s.newClient(adminClientName)
	}
	if err != nil {
		return fmt.Errorf("connect to %s: %w", s.addr, err)
	}
	info, err := s.info(ctx, "server")
	if err != nil {
		return err
	}
	s.version = infoField(info, "redis_version")
	return nil
}

// newClient returns a new client of the server. Its connections carry name,
// which SLOWLOG entries show.
func (s *server) newClient(name string) (rueidis.Client, error) {
	return rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.addr}, DisableCache: true, ForceSingleClient: true, ClientName: name})
}

// pin restricts every thread of process pid to cpu.
func pin(pid, cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return fmt.Errorf("pin redis-server to CPU %d: %w", cpu, err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			return fmt.Errorf("pin redis-server to CPU %d: %w", cpu, err)
		}
	}
	return nil
}

// close closes the clients and stops the bench's own server.
func (s *server) close() error {
	for _, c := range []rueidis.Client{s.client, s.admin} {
		if c != nil {
			c.Close()
		}
	}
	if s.own != nil {
		return s.own.Stop()
	}
	return nil
}

// reset deletes everything a run left, waits until the server has freed it,
// and returns once it is idle. On the bench's own server it flushes the
// database; on another it deletes only the keys under keyPrefix.
func (s *server) reset(ctx context.Context) error {
	// Deletes are asynchronous, and settle waits for the background frees:
	// a synchronous delete of a 5M-field hash blocks the connection for
	// longer than the client's read timeout.
	c := s.admin
	if s.own != nil {
		if err := c.Do(ctx, c.B().Flushall().Async().Build()).Error(); err != nil {
			return fmt.Errorf("FLUSHALL: %w", err)
		}
	} else {
		ks, err := scanKeys(ctx, c, keyPrefix+"*")
		if err != nil {
			return err
		}
		for len(ks) > 0 {
			chunk := ks[:min(len(ks), 1000)]
			ks = ks[len(chunk):]
			if err := c.Do(ctx, c.B().Unlink().Key(chunk...).Build()).Error(); err != nil {
				return fmt.Errorf("UNLINK: %w", err)
			}
		}
	}
	return s.settle(ctx)
}

// settle waits until the server has no background frees pending (an UNLINK
// of a big value runs in a background thread, which would compete with the
// next run for the CPU).
func (s *server) settle(ctx context.Context) error {
	deadline := time.Now().Add(settleTimeout)
	for {
		info, err := s.info(ctx, "memory")
		if err != nil {
			return err
		}
		if infoField(info, "lazyfree_pending_objects") == "0" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the server still frees objects in the background after %v", settleTimeout)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// info returns INFO section.
func (s *server) info(ctx context.Context, section string) (string, error) {
	info, err := s.admin.Do(ctx, s.admin.B().Info().Section(section).Build()).ToString()
	if err != nil {
		return "", fmt.Errorf("INFO %s: %w", section, err)
	}
	return info, nil
}

// serverUsage is what the server has used so far: CPU time of all its
// threads, and per-command statistics.
type serverUsage struct {
	cpu      time.Duration
	commands map[string]commandStat
}

// commandStat is one command's line of INFO commandstats.
type commandStat struct {
	Calls int64 `json:"calls"`
	Usec  int64 `json:"usec"`
}

// usage reads INFO cpu and commandstats.
func (s *server) usage(ctx context.Context) (serverUsage, error) {
	info, err := s.info(ctx, "cpu")
	if err != nil {
		return serverUsage{}, err
	}
	var cpu float64
	for _, f := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(infoField(info, f), 64)
		if err != nil {
			return serverUsage{}, fmt.Errorf("INFO cpu %s: %w", f, err)
		}
		cpu += v
	}
	u := serverUsage{cpu: time.Duration(cpu * float64(time.Second))}
	if u.commands, err = s.commandStats(ctx); err != nil {
		return serverUsage{}, err
	}
	return u, nil
}

// commandStats reads INFO commandstats, by lower-case command name.
func (s *server) commandStats(ctx context.Context) (map[string]commandStat, error) {
	info, err := s.info(ctx, "commandstats")
	if err != nil {
		return nil, err
	}
	out := map[string]commandStat{}
	// cmdstat_hset:calls=1000,usec=1200345,usec_per_call=1200.35,...
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st commandStat
		for kv := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				st.Calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				st.Usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return out, nil
}

// since returns the usage between before and u.
func (u serverUsage) since(before serverUsage) serverUsage {
	return serverUsage{cpu: u.cpu - before.cpu, commands: statsSince(u.commands, before.commands)}
}

// statsSince returns the commands called between the commandstats before
// and after.
func statsSince(after, before map[string]commandStat) map[string]commandStat {
	d := map[string]commandStat{}
	for name, st := range after {
		b := before[name]
		if st.Calls != b.Calls {
			d[name] = commandStat{Calls: st.Calls - b.Calls, Usec: st.Usec - b.Usec}
		}
	}
	return d
}

// infoField returns the value of name in an INFO reply, or "".
func infoField(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// scanKeys returns every key matching match.
func scanKeys(ctx context.Context, c rueidis.Client, match string) ([]string, error) {
	var out []string
	var cursor uint64
	for {
		e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(match).Count(1000).Build()).AsScanEntry()
		if err != nil {
			return nil, fmt.Errorf("SCAN %s: %w", match, err)
		}
		out = append(out, e.Elements...)
		if cursor = e.Cursor; cursor == 0 {
			return out, nil
		}
	}
}

// configGet returns a configuration parameter.
func (s *server) configGet(ctx context.Context, name string) (string, error) {
	m, err := s.admin.Do(ctx, s.admin.B().ConfigGet().Parameter(name).Build()).AsStrMap()
	if err != nil {
		return "", fmt.Errorf("CONFIG GET %s: %w", name, err)
	}
	v, ok := m[name]
	if !ok {
		return "", errors.New("CONFIG GET " + name + ": no such parameter")
	}
	return v, nil
}

// configSet sets a configuration parameter.
func (s *server) configSet(ctx context.Context, name, value string) error {
	if err := s.admin.Do(ctx, s.admin.B().ConfigSet().ParameterValue().ParameterValue(name, value).Build()).Error(); err != nil {
		return fmt.Errorf("CONFIG SET %s %s: %w", name, value, err)
	}
	return nil
}
