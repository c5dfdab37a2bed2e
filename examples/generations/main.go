// Generations rebuilds an index in Generations mode twice while a reader
// reads it, then rolls it back and forward by flipping its pointer.
//
//	go run ./examples/generations                         # embedded Redis, nothing to install
//	go run ./examples/generations -redis redis://127.0.0.1:6379
//
// The index is one set of user ids per country, a builders.SetIndex family:
//
//	gens:users:by-country:<c>   set   ids of the users who live in country c
//
// In Generations mode (rebuild.Options.Publish = rebuild.Generations) a run
// writes the index under a new generation G, at
// gens:users:by-country:rebuild-g:G:<c>, and publishes it by setting the
// index's pointer, gens:users:by-country:rebuild-ptr, to G: one SET,
// whatever the size of the index. A reader (package reader) resolves the
// pointer before it reads; an index without a pointer is read at its plain
// keys. The program prints the pointer, the registry of generations, what a
// reader reads before and after each flip, and a rollback, which is a flip
// back to the generation kept as the previous one. A reader polls every
// bucket meanwhile and counts the times it saw one missing or half-built:
// 0, or the program exits with status 1.
//
// Without -redis (or REDIS_URL) the program runs on an embedded miniredis;
// with it, it writes only keys of the index gens:users:by-country and
// leaves them there. On a Redis Cluster the family needs no hash tag in
// this mode: its buckets spread over the cluster's slots, and the pointer
// is {gens:users:by-country}:rebuild-ptr, in the slot of the index's lock.
// -h prints the usage and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keyswap/keyswap/builders"
	"github.com/keyswap/keyswap/examples/internal/cli"
	"github.com/keyswap/keyswap/examples/internal/connect"
	"github.com/keyswap/keyswap/reader"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/sources"
	"github.com/redis/rueidis"
)

// prefix is the family's prefix: bucket c of the index is prefix:c in the
// plain shape.
const prefix = "gens:users:by-country"

// countries are the family's buckets, in the order the program prints
// them.
var countries = []string{"br", "de", "fr", "uk", "us"}

type user struct{ ID, Country string }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cli.Main("generations", func() error { return run(ctx, os.Args[1:], os.Stdout, os.Stderr) })
}

// run is the program, with its arguments and output injectable for tests.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("generations", flag.ContinueOnError)
	url := connect.Flag(fs)
	n := fs.Int("users", 20000, "number of users")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: go run ./examples/generations [-redis URL] [-users N]

Generations rebuilds one set of user ids per country in Generations mode
twice while a reader reads it, and rolls it back and forward by flipping
its pointer. Without -redis it runs on an embedded Redis; with it, it
writes only keys of the index "gens:users:by-country" and leaves them there.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := cli.Parse(fs, args, stdout, stderr); err != nil {
		return err
	}
	// On the embedded miniredis, connect.Open creates the client with
	// rueidis.ClientOption.DisableCache: miniredis has no CLIENT TRACKING,
	// and rueidis refuses to connect to it with client-side caching on.
	// The reader then resolves the pointer with a GET before every read
	// (one round trip more), and always sees the current generation. On a
	// real Redis the client keeps rueidis's default client-side caching:
	// the pointer is cached, and a flip invalidates it.
	client, where, closeFn, err := connect.Open(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	cluster := client.Mode() == rueidis.ClientModeCluster
	fmt.Fprintf(stdout, "keyswap generations on %s\n", where)

	// The reader caches a pointer for at most CacheTTL, even if Redis's
	// invalidation is lost; the writer keeps a generation it flipped away
	// from readable for Grace, which must exceed the CacheTTL of every
	// reader. Both are short here so that the example does not wait; the
	// defaults are 5 s and 10 s.
	rd, err := reader.New(client, reader.Options{CacheTTL: time.Second})
	if err != nil {
		return err
	}
	byCountry := builders.SetIndex(prefix, func(u user) (bucket, member string, ok bool) {
		return u.Country, u.ID, true
	})
	r, err := rebuild.New(client, rebuild.Options{
		Publish:      rebuild.Generations,
		Grace:        2 * time.Second,
		KeepPrevious: time.Hour, // keep the generation a flip replaces, for a rollback
	}, byCountry)
	if err != nil {
		return err
	}
	yesterday, today := generate(*n)
	w := &writer{ctx: ctx, client: client, cluster: cluster, reader: rd, out: stdout}

	before, err := w.look()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nbefore any run: %s\n", before.describe())

	// 1. Yesterday's run creates the pointer.
	stats, err := r.Run(ctx, sources.Slice(yesterday))
	if err != nil {
		return fmt.Errorf("yesterday's run: %w", err)
	}
	first := ""
	if before.gen == 0 {
		first = " (the first flip creates the pointer)"
	}
	fmt.Fprintf(stdout, "\n1. yesterday's run wrote %d users into generation %d and flipped the pointer to it%s\n",
		stats.Items, stats.Generations[prefix], first)
	if err := w.show(stats.Generations[prefix]); err != nil {
		return err
	}
	gen1, err := w.look()
	if err != nil {
		return err
	}
	if err := verify(gen1, yesterday); err != nil {
		return fmt.Errorf("after yesterday's run: %w", err)
	}
	fmt.Fprintf(stdout, "   the reader caches the pointer client-side: %v\n", rd.Cached())

	// 2. Today's run, while a reader polls every bucket.
	watch := startWatch(ctx, rd, yesterday, today)
	stats, err = r.Run(ctx, sources.Slice(today))
	if err != nil {
		watch()
		return fmt.Errorf("today's run: %w", err)
	}
	gen2 := stats.Generations[prefix]
	fmt.Fprintf(stdout, "\n2. today's run wrote %d users into generation %d and flipped the pointer to it; generation %d stays, as the previous one\n",
		stats.Items, gen2, gen1.gen)
	if err := w.show(gen2); err != nil {
		return err
	}
	after, err := w.look()
	if err != nil {
		return err
	}
	if err := verify(after, today); err != nil {
		return fmt.Errorf("after today's run: %w", err)
	}
	fmt.Fprintln(stdout, "   What a reader sees before and after the flip:")
	printViews(stdout, gen1, after)

	// 3. A rollback is a flip back to the previous generation, and the
	// generation rolled back becomes the previous one: a second rollback
	// rolls forward.
	gens, err := r.Rollback(ctx)
	if err != nil {
		watch()
		return fmt.Errorf("rolling back: %w", err)
	}
	fmt.Fprintf(stdout, "\n3. rolled back: the pointer names generation %d again, and generation %d is the previous one\n", gens[prefix], gen2)
	if err := w.show(gens[prefix]); err != nil {
		return err
	}
	back, err := w.look()
	if err != nil {
		return err
	}
	if err := verify(back, yesterday); err != nil {
		return fmt.Errorf("after the rollback: %w", err)
	}
	fmt.Fprintf(stdout, "   the reader reads %s: %d users in br, as yesterday\n", back.keys["br"], back.sizes["br"])
	if gens, err = r.Rollback(ctx); err != nil {
		watch()
		return fmt.Errorf("rolling forward: %w", err)
	}
	fmt.Fprintf(stdout, "   rolled forward: the pointer names generation %d\n", gens[prefix])
	if err := w.follow(gens[prefix]); err != nil {
		return err
	}
	forward, err := w.look()
	if err != nil {
		return err
	}
	if err := verify(forward, today); err != nil {
		return fmt.Errorf("after rolling forward: %w", err)
	}

	seen := watch()
	fmt.Fprintf(stdout, "\na concurrent reader read every bucket %d times during the run and the flips: %d times one was missing, %d times half-built\n",
		seen.polls, seen.missing, seen.halfBuilt)
	if seen.err != nil {
		return fmt.Errorf("the concurrent reader: %w", seen.err)
	}
	if seen.missing > 0 || seen.halfBuilt > 0 {
		return errors.New("the reader saw a missing or half-built bucket")
	}
	if cluster {
		slots, err := w.slots(forward)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "on this cluster the %d buckets of generation %d are in %d hash slots: no hash tag is needed in this mode\n",
			len(forward.present()), forward.gen, slots)
	}
	fmt.Fprintf(stdout, "verified: generation %d matches today's %d users exactly\n", forward.gen, len(today))
	return nil
}

// generate returns yesterday's and today's users: today nobody lives in
// Brazil any more (they moved to the UK), and every seventh user moved to
// France.
func generate(n int) (yesterday, today []user) {
	for i := range n {
		id := fmt.Sprintf("u%05d", i)
		c := countries[i%len(countries)]
		yesterday = append(yesterday, user{id, c})
		switch {
		case i%7 == 0:
			c = "fr"
		case c == "br":
			c = "uk"
		}
		today = append(today, user{id, c})
	}
	return yesterday, today
}

// buckets returns the members of each bucket of users.
func buckets(users []user) map[string][]string {
	out := map[string][]string{}
	for _, u := range users {
		out[u.Country] = append(out[u.Country], u.ID)
	}
	for _, ms := range out {
		slices.Sort(ms)
	}
	return out
}

// writer prints what the writer's side holds, and what the reader reads.
type writer struct {
	ctx     context.Context
	client  rueidis.Client
	cluster bool
	reader  *reader.Reader
	out     io.Writer
}

// base is the key the index's pointer and registry hang off: the prefix on
// a standalone server; on a cluster, a key in the slot of the index's lock,
// "{prefix}" for a prefix without a hash tag (docs/generations.md, "Key
// shapes").
func (w *writer) base() string {
	if w.cluster {
		return "{" + prefix + "}"
	}
	return prefix
}

// show prints the pointer and the registry, as GET and HGETALL read them,
// once the reader follows the flip to gen.
func (w *writer) show(gen int64) error {
	ptr, reg := w.base()+":rebuild-ptr", w.base()+":rebuild-gens"
	p, err := w.client.Do(w.ctx, w.client.B().Get().Key(ptr).Build()).ToString()
	if err != nil {
		return fmt.Errorf("GET %s: %w", ptr, err)
	}
	fields, err := w.client.Do(w.ctx, w.client.B().Hgetall().Key(reg).Build()).AsStrMap()
	if err != nil {
		return fmt.Errorf("HGETALL %s: %w", reg, err)
	}
	fmt.Fprintf(w.out, "   GET %s        %s\n", ptr, p)
	var states []string
	for _, f := range slices.Sorted(maps.Keys(fields)) {
		states = append(states, f+"="+fields[f])
	}
	fmt.Fprintf(w.out, "   HGETALL %s   %s\n", reg, strings.Join(states, " "))
	return w.follow(gen)
}

// follow waits until the reader resolves the index to gen. On a real Redis
// the reader's cached pointer is invalidated by a push on the reader's own
// connection, which may arrive a moment after the writer's flip returned
// (at worst CacheTTL later, if it is lost); on miniredis every resolve is a
// GET, and the first one sees gen.
func (w *writer) follow(gen int64) error {
	want := fmt.Sprintf("%s:rebuild-g:%d:uk", prefix, gen)
	deadline := time.Now().Add(w.reader.CacheTTL() + 5*time.Second)
	for {
		key, err := w.reader.Bucket(w.ctx, prefix, "uk")
		if err != nil {
			return err
		}
		if key == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the reader still reads %s, not %s, %v after the flip", key, want, w.reader.CacheTTL())
		}
		select {
		case <-w.ctx.Done():
			return w.ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// view is what the reader reads of the index at one moment.
type view struct {
	gen   int64             // the generation the reader resolved; 0: none
	keys  map[string]string // per bucket, the key the reader resolved
	sizes map[string]int    // per bucket, its number of members
	inFR  bool              // SISMEMBER of u00014 in fr: moved there today
	data  map[string][]string
}

// look reads every bucket through the reader.
func (w *writer) look() (view, error) {
	v := view{keys: map[string]string{}, sizes: map[string]int{}, data: map[string][]string{}}
	for _, c := range countries {
		key, err := w.reader.Bucket(w.ctx, prefix, c)
		if err != nil {
			return v, err
		}
		ms, err := w.reader.SMembers(w.ctx, reader.InBucket(prefix, c))
		if err != nil {
			return v, err
		}
		slices.Sort(ms)
		v.keys[c], v.sizes[c], v.data[c] = key, len(ms), ms
		if _, err := fmt.Sscanf(strings.TrimPrefix(key, prefix+":rebuild-g:"), "%d:", &v.gen); err != nil {
			v.gen = 0
		}
	}
	in, err := w.reader.SIsMember(w.ctx, reader.InBucket(prefix, "fr"), "u00014")
	v.inFR = in
	return v, err
}

// describe says where the reader reads.
func (v view) describe() string {
	if v.gen == 0 {
		return fmt.Sprintf("no pointer, so the reader reads the plain keys (%s, ...): %d users in fr", v.keys["fr"], v.sizes["fr"])
	}
	return fmt.Sprintf("the reader reads generation %d (%s, ...)", v.gen, v.keys["fr"])
}

// present returns the buckets that hold members.
func (v view) present() []string {
	var out []string
	for _, c := range countries {
		if v.sizes[c] > 0 {
			out = append(out, v.keys[c])
		}
	}
	return out
}

// slots counts the hash slots of the view's buckets.
func (w *writer) slots(v view) (int, error) {
	seen := map[int64]bool{}
	for _, k := range v.present() {
		s, err := w.client.Do(w.ctx, w.client.B().ClusterKeyslot().Key(k).Build()).AsInt64()
		if err != nil {
			return 0, err
		}
		seen[s] = true
	}
	return len(seen), nil
}

// printViews prints the reads of before and after side by side, with the
// key each read went to.
func printViews(w io.Writer, before, after view) {
	fmt.Fprintf(w, "     %-34s %-10s %s\n", "read", fmt.Sprintf("gen %d", before.gen), fmt.Sprintf("gen %d", after.gen))
	fmt.Fprintf(w, "     %-34s %-10v %v\n", "SISMEMBER fr u00014", before.inFR, after.inFR)
	for _, c := range countries {
		fmt.Fprintf(w, "     %-34s %-10d %d\n", "SCARD "+c, before.sizes[c], after.sizes[c])
	}
	fmt.Fprintf(w, "     bucket fr read at %s, then at %s\n", before.keys["fr"], after.keys["fr"])
}

// verify checks that v holds exactly users, bucket by bucket.
func verify(v view, users []user) error {
	want := buckets(users)
	for _, c := range countries {
		if !slices.Equal(v.data[c], want[c]) {
			return fmt.Errorf("bucket %s (%s) holds %d members, want %d", c, v.keys[c], len(v.data[c]), len(want[c]))
		}
	}
	return nil
}

// seen is what the concurrent reader saw.
type seen struct {
	polls, missing, halfBuilt int
	err                       error
}

// startWatch starts a reader that reads every bucket, each read resolving
// the pointer, until the returned function is called; that function
// returns what it saw. A bucket must hold exactly yesterday's or today's
// members: a bucket read empty when neither is empty is missing, any other
// set half-built.
func startWatch(ctx context.Context, rd *reader.Reader, yesterday, today []user) func() seen {
	versions := []map[string][]string{buckets(yesterday), buckets(today)}
	stop := make(chan struct{})
	var s seen
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			for _, c := range countries {
				ms, err := rd.SMembers(ctx, reader.InBucket(prefix, c))
				if err != nil {
					s.err = err
					return
				}
				slices.Sort(ms)
				switch {
				case slices.Equal(ms, versions[0][c]), slices.Equal(ms, versions[1][c]):
				case len(ms) == 0:
					s.missing++
				default:
					s.halfBuilt++
				}
			}
			s.polls++
			select {
			case <-stop:
				return
			default:
			}
		}
	})
	return func() seen {
		close(stop)
		wg.Wait()
		return s
	}
}
