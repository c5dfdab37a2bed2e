package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/redis/rueidis"
	// Imported by another name: rate is the report's formatter of items/s.
	timerate "golang.org/x/time/rate"
)

const (
	// onlineWriters is the number of the application's goroutines that
	// commit and apply changes, sharing one rate limit. One alone would
	// make at most one change per round trip, fewer than 10,000 a second
	// once Apply waits behind a rebuild's transactions. Each owns the items
	// whose index is its own modulo onlineWriters, so that the changes to
	// one item are committed and applied in order, by one goroutine, as
	// Apply requires.
	onlineWriters = 32
	// applyTimeout bounds an Apply that must finish although the writers
	// are stopping.
	applyTimeout = 30 * time.Second
)

// application is what the online section's writers stand for: an
// application that commits each change to its source of truth, then applies
// it to the indexes through its own Rebuilder, on its own connection.
type application struct {
	rb      *rebuild.Rebuilder[item]
	truth   *truth
	seed    uint64
	version atomic.Int64 // of the hash values the changes write
	runs    atomic.Int64 // calls of run, so that each draws other changes
	applied atomic.Int64
}

// dial opens the application's connection to addr, with the options of the
// bench's own clients: its Apply calls do not queue behind the rebuild's
// round trips on the rebuild's connection.
func dial(addr string) (rueidis.Client, error) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	return c, nil
}

// call is one Apply: when it started, and how long it took.
type call struct {
	start time.Time
	took  time.Duration
}

// change commits an update of item i to the truth, then applies it with
// one Update that rewrites the item's hash value, score and bucket. The
// Apply survives the cancellation of ctx: a committed change is always
// applied, or the truth and the keys would disagree.
func (a *application) change(ctx context.Context, i int, rng *rand.Rand) (call, error) {
	d := a.truth.d
	v := a.version.Add(1)
	old, new := a.truth.commit(i, func(old item) item {
		u := old
		u.value = fmt.Sprintf("%s@v%06d.test", old.member, v%1_000_000)
		u.score = float64(rng.IntN(10_000_000))
		u.bucket = d.buckets[rng.IntN(len(d.buckets))]
		return u
	})
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), applyTimeout)
	defer cancel()
	start := time.Now()
	err := a.rb.Apply(actx, index.Update(old, new))
	c := call{start: start, took: time.Since(start)}
	if err != nil {
		return c, fmt.Errorf("apply a change to %s: %w", old.member, err)
	}
	a.applied.Add(1)
	return c, nil
}

// run changes random items, perSecond changes a second in all, from
// onlineWriters goroutines, until ctx is done, and returns every Apply's
// call. A done ctx is how the writers stop, not an error: each finishes the
// change it committed. The first failed Apply stops them all, and is the
// error.
func (a *application) run(ctx context.Context, perSecond float64) ([]call, error) {
	lim := timerate.NewLimiter(timerate.Limit(perSecond), 1)
	ctx, stop := context.WithCancel(ctx) // a failed writer stops the others
	defer stop()
	n := a.truth.d.n
	seed := uint64(a.runs.Add(1)) << 32
	calls := make([][]call, onlineWriters)
	var wg sync.WaitGroup
	errs := make([]error, onlineWriters)
	for w := range onlineWriters {
		owned := (n - w + onlineWriters - 1) / onlineWriters // items w, w+onlineWriters, ...
		if owned <= 0 {
			continue
		}
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(a.seed, seed|uint64(w)))
			for lim.Wait(ctx) == nil {
				c, err := a.change(ctx, w+onlineWriters*rng.IntN(owned), rng)
				if err != nil {
					errs[w] = err
					stop()
					return
				}
				calls[w] = append(calls[w], c)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	out := slices.Concat(calls...)
	slices.SortFunc(out, func(x, y call) int { return x.start.Compare(y.start) })
	return out, nil
}

// latency is the distribution of the Apply calls of one phase of a round.
type latency struct {
	Calls int           `json:"calls"`
	P50   time.Duration `json:"p50_ns"`
	P99   time.Duration `json:"p99_ns"`
	Max   time.Duration `json:"max_ns"`
	// Server is the server's mean time per EVALSHA meanwhile (INFO
	// commandstats), which the run's own few scripts hardly change.
	Server time.Duration `json:"server_per_call_ns"`
}

// newLatency summarises the calls that started at from or later and ended
// by to; a zero from or to leaves that side open.
func newLatency(calls []call, from, to time.Time) latency {
	var ds []time.Duration
	for _, c := range calls {
		if (from.IsZero() || !c.start.Before(from)) && (to.IsZero() || !c.start.Add(c.took).After(to)) {
			ds = append(ds, c.took)
		}
	}
	if len(ds) == 0 {
		return latency{}
	}
	slices.Sort(ds)
	return latency{Calls: len(ds), P50: percentile(ds, 50), P99: percentile(ds, 99), Max: ds[len(ds)-1]}
}

// overlapping counts the calls that ran, at least in part, between from
// and to.
func overlapping(calls []call, from, to time.Time) int {
	n := 0
	for _, c := range calls {
		if c.start.Before(to) && c.start.Add(c.took).After(from) {
			n++
		}
	}
	return n
}

// percentile returns the p-th percentile of sorted, by the nearest rank:
// the smallest value that at least p% of the values do not exceed.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}
