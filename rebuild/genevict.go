package rebuild

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/scan"
	"github.com/redis/rueidis"
)

// A run with Options.SkipSizeCheck does not count its keys' sizes, so it
// cannot tell which of its keys Redis lost. It still tells that Redis
// evicted keys during the run, coarsely: it reads evicted_keys and run_id
// (one INFO server stats) of every master before it allocates its
// generations, and again where the size check would run, before the flip.
// A count that changed (grew: keys were evicted, whose they were is not
// known; went down: CONFIG RESETSTAT, which hides what was evicted
// meanwhile), a master with another run_id (a restart, or another
// process at its address) and a set of masters that changed (a failover)
// fail the run with ErrTempKeyLost before the flip, every index left at
// its generation.

// masterStats are what the run reads of each master, by address.
type masterStats map[string]masterStat

// masterStat is a master's run_id and evicted_keys.
type masterStat struct {
	runID   string
	evicted int64
}

// evictionWatch is the coarse check of a run with Options.SkipSizeCheck
// (see above): the masters' stats at the run's start, and what it needs
// to read them again.
type evictionWatch struct {
	key    string // the run's, for errors
	client rueidis.Client
	start  masterStats
}

// watchEvictions reads the stats of every master of r's client: the start
// of a run's eviction watch. A master that refuses INFO fails it with an
// error matching ErrNoPermission that names INFO and the master.
func watchEvictions(ctx context.Context, op string, r *core) (*evictionWatch, error) {
	w := &evictionWatch{key: r.key, client: r.redis.Client()}
	start, err := w.read(ctx, op)
	if err != nil {
		return nil, err
	}
	w.start = start
	return w, nil
}

// read returns the stats of every master.
func (w *evictionWatch) read(ctx context.Context, op string) (masterStats, error) {
	nodes, err := scan.MasterNodes(ctx, w.client)
	if err != nil {
		return nil, protocol.Fail(ctx, op, w.key, fmt.Errorf("the masters whose evicted_keys SkipSizeCheck watches: %w", err))
	}
	out := make(masterStats, len(nodes))
	for _, n := range nodes {
		c := n.Client
		// One INFO with both sections (Redis 7.0 takes several).
		info, err := c.Do(ctx, c.B().Info().Section("server", "stats").Build()).ToString()
		if err != nil {
			if perr := refused(err); perr != nil {
				err = perr
			}
			return nil, protocol.Fail(ctx, op, w.key, fmt.Errorf("INFO on master %s, which SkipSizeCheck needs to read its evicted_keys: %w", n.Addr, err))
		}
		var s masterStat
		for i, field := range []string{"run_id", "evicted_keys"} {
			v, ok := infoField(info, field)
			if !ok {
				return nil, &Error{Op: op, Key: w.key, Err: fmt.Errorf("INFO on master %s has no %s", n.Addr, field)}
			}
			if i == 0 {
				s.runID = v
			} else if s.evicted, err = strconv.ParseInt(v, 10, 64); err != nil {
				return nil, &Error{Op: op, Key: w.key, Err: fmt.Errorf("INFO on master %s: evicted_keys %q: %w", n.Addr, v, err)}
			}
		}
		out[n.Addr] = s
	}
	return out, nil
}

// infoField returns the value of field in an INFO reply.
func infoField(info, field string) (string, bool) {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), field+":"); ok {
			return v, true
		}
	}
	return "", false
}

// check reads the masters' stats again, and fails the run if any changed
// since its start (see above).
func (w *evictionWatch) check(ctx context.Context) error {
	now, err := w.read(ctx, "publish")
	if err != nil {
		return err
	}
	refuse := func(format string, args ...any) error {
		return &Error{Op: "publish", Key: w.key, Err: fmt.Errorf("%w: "+format+"; with SkipSizeCheck the run cannot tell whether it lost keys of its own; every index left at its generation", append([]any{ErrTempKeyLost}, args...)...)}
	}
	for _, addr := range slices.Sorted(maps.Keys(w.start)) {
		was := w.start[addr]
		is, ok := now[addr]
		switch {
		case !ok:
			return refuse("master %s is no longer a master (a failover during the run)", addr)
		case is.runID != was.runID:
			return refuse("master %s is another process than at the run's start (run_id %s, then %s: a restart or a failover)", addr, was.runID, is.runID)
		case is.evicted > was.evicted:
			return refuse("master %s evicted %d keys during the run (evicted_keys %d at its start, %d now)", addr, is.evicted-was.evicted, was.evicted, is.evicted)
		case is.evicted != was.evicted:
			return refuse("master %s's evicted_keys went from %d at the run's start to %d (CONFIG RESETSTAT: what it evicted meanwhile is not known)", addr, was.evicted, is.evicted)
		}
	}
	for _, addr := range slices.Sorted(maps.Keys(now)) {
		if _, ok := w.start[addr]; !ok {
			return refuse("master %s was not a master at the run's start (a failover during the run)", addr)
		}
	}
	return nil
}
