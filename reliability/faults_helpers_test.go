package reliability

// Helpers of the fault suite (faults_test.go): the three data sets, the
// deployments a case runs on (a private server behind a faultproxy.Proxy,
// or a cluster behind a faultproxy.Dialer), the hook that stops a run at an
// injection point and hands control to the test goroutine, the reader that
// watches the live keys for gaps, the state checks and the report.

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidishook"

	"github.com/keyswap/keyswap/index"
	"github.com/keyswap/keyswap/internal/faultproxy"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/keyswap/keyswap/rebuild"
	"github.com/keyswap/keyswap/store"
)

// Sizes and timings of the fault suite. The TTL is short so that a stall
// "past the TTL" costs seconds, not minutes; PreserveFor is far from it, so
// that a preserved temp key and a leased one are told apart.
const (
	faultItems      = 2000 // items per run: 10 batches
	faultBatch      = 200  // BatchSize of the faulted run
	faultWriters    = 2    // Writers: at most 2 batches per DoMulti
	faultMidDoMulti = 3    // mid-stream: the 3rd write DoMulti (after 2-4 of 10 batches)
	// MaxMerged of the faulted run: a batch's worth, so that the family's
	// merged writes go out with the batches, and a fault mid-stream finds
	// its buckets' temp keys partly written too. With
	// the default (2^20 entries) every bucket's members would wait for a
	// full command of MaxMergeArgs (1000), that is for the end of the
	// source, and no fault before the publish would meet them.
	faultMaxMerged   = faultBatch
	faultTTL         = 4 * time.Second // lease of the faulted run: 2 s lapsed under load (3 suites at once, -race)
	faultPreserveFor = 30 * time.Second
	faultReceiptTTL  = 30 * time.Second                // how long a publish's receipt lives (internal/protocol)
	faultHold        = faultTTL + 500*time.Millisecond // stall and SIGSTOP: longer than the TTL
	faultRunTimeout  = 60 * time.Second                // bounds every Run (the rebuild client has no keepalive)
	faultWait        = 15 * time.Second                // bounds every poll
	closeGrace       = 5 * time.Second                 // for a closed client's connections to end on their own
	holdingBusy      = 4                               // holding cases busy at once (see caseT)
)

// fuser is the item type of the fault suite.
type fuser = redistest.User

// dataset is one version of the source of truth. v1 seeds the live keys
// (the "old" value), v2 is the faulted run's (the "new" value), v3 a
// successor's.
type dataset int

const (
	v1 dataset = iota + 1
	v2
	v3
)

func (d dataset) String() string {
	return [...]string{"", "old", "new", "successor's"}[d]
}

// countries are each data set's SetIndex buckets, disjoint, so that a
// bucket names the run that published it.
var countries = map[dataset][]string{v1: {"fr", "de", "us"}, v2: {"it", "es"}, v3: {"pt", "nl"}}

// items returns faultItems users of data set d: every live key differs
// between two data sets.
func (d dataset) items() []fuser {
	out := make([]fuser, faultItems)
	cs := countries[d]
	for i := range out {
		out[i] = fuser{
			ID:      fmt.Sprintf("u%05d", i),
			Email:   fmt.Sprintf("v%d-user%05d@example.com", d, i),
			Country: cs[i%len(cs)],
			Score:   float64(int(d)*100000 + i),
		}
	}
	return out
}

// shape names the live keys of one case: a Hash, a SortedSet and a
// SetIndex family, under the case's prefix.
type shape struct{ email, score, country string }

func newShape(prefix string) shape {
	return shape{email: prefix + "by-email", score: prefix + "by-score", country: prefix + "by-country"}
}

// keys returns the builders' keys (the family's prefix), each of which has
// a generation record.
func (s shape) keys() []string { return []string{s.email, s.score, s.country} }

// builders returns the builders of the three indexes, those of the
// online model.
func (s shape) builders() []index.Builder[fuser] {
	return redistest.OnlineIndexes{Hash: s.email, Zset: s.score, Family: s.country}.Builders()
}

// content is a live key's whole value, canonical: its type, its entries
// sorted, and whether it has an expiry.
type content struct {
	typ     string
	entries []string
	expires bool
}

func (c content) String() string {
	return fmt.Sprintf("%s of %d entries (expires: %v)", c.typ, len(c.entries), c.expires)
}

func sameContent(a, b content) bool {
	return a.typ == b.typ && a.expires == b.expires && slices.Equal(a.entries, b.entries)
}

func zentry(member string, score float64) string {
	return member + "\x00" + strconv.FormatFloat(score, 'g', -1, 64)
}

// expected returns the live keys of s after a successful run over d.
func (s shape) expected(d dataset) map[string]content {
	var email, score []string
	sets := map[string][]string{}
	for _, u := range d.items() {
		email = append(email, u.Email+"\x00"+u.ID)
		score = append(score, zentry(u.ID, u.Score))
		k := s.country + ":" + u.Country
		sets[k] = append(sets[k], u.ID)
	}
	out := map[string]content{
		s.email: {typ: "hash", entries: sorted(email)},
		s.score: {typ: "zset", entries: sorted(score)},
	}
	for k, ms := range sets {
		out[k] = content{typ: "set", entries: sorted(ms)}
	}
	return out
}

func sorted(s []string) []string { slices.Sort(s); return s }

// isLive reports whether k is a live key: none of the keys keyswap keeps
// next to one (a temp key, a lock, a lock's record, log or receipt, a
// generation record).
func isLive(k string) bool { return !keys.Reserved(k) }

// liveOnly returns the states of the live keys of snap.
func liveOnly(snap map[string]redistest.KeyState) map[string]redistest.KeyState {
	for k := range snap {
		if !isLive(k) {
			delete(snap, k)
		}
	}
	return snap
}

// readLive returns the content of every live key under prefix.
func readLive(t testing.TB, c rueidis.Client, prefix string) map[string]content {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), faultWait)
	defer cancel()
	out := map[string]content{}
	for _, k := range redistest.Keys(t, c, prefix) {
		if !isLive(k) {
			continue
		}
		typ, err := c.Do(ctx, c.B().Type().Key(k).Build()).ToString()
		if err != nil {
			t.Fatalf("TYPE %s: %v", k, err)
		}
		var entries []string
		switch typ {
		case "none":
			continue // deleted since SCAN
		case "hash":
			m, err := c.Do(ctx, c.B().Hgetall().Key(k).Build()).AsStrMap()
			if err != nil {
				t.Fatalf("HGETALL %s: %v", k, err)
			}
			for f, v := range m {
				entries = append(entries, f+"\x00"+v)
			}
		case "zset":
			zs, err := c.Do(ctx, c.B().Zrange().Key(k).Min("0").Max("-1").Withscores().Build()).AsZScores()
			if err != nil {
				t.Fatalf("ZRANGE %s: %v", k, err)
			}
			for _, z := range zs {
				entries = append(entries, zentry(z.Member, z.Score))
			}
		case "set":
			if entries, err = c.Do(ctx, c.B().Smembers().Key(k).Build()).AsStrSlice(); err != nil {
				t.Fatalf("SMEMBERS %s: %v", k, err)
			}
		default:
			entries = []string{"unexpected type"}
		}
		ms, err := c.Do(ctx, c.B().Pttl().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatalf("PTTL %s: %v", k, err)
		}
		out[k] = content{typ: typ, entries: sorted(entries), expires: ms != -1}
	}
	return out
}

// sameLive reports whether got is exactly want, and if not, why.
func sameLive(got, want map[string]content) (bool, string) {
	var why []string
	for _, k := range sortedKeys(want) {
		g, ok := got[k]
		switch {
		case !ok:
			why = append(why, k+" missing")
		case !sameContent(g, want[k]):
			why = append(why, fmt.Sprintf("%s is a %v, want a %v", k, g, want[k]))
		}
	}
	for _, k := range sortedKeys(got) {
		if _, ok := want[k]; !ok {
			why = append(why, k+" extra")
		}
	}
	return len(why) == 0, strings.Join(why, "; ")
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Kinds of leftover.
const (
	leftLock    = "lock"
	leftRecord  = "record"  // a lock's run record or log: they live no longer than the lock
	leftReceipt = "receipt" // the receipt of a publish, "<lock>:done"
	leftTemp    = "temp"
)

// leftover is a key of a run left under a case's prefix: a temp key, a
// lock, a lock's record or log, or a receipt.
type leftover struct {
	key  string
	kind string        // leftLock, ...
	pttl time.Duration // -1: no expiry
}

// leftoverKind returns the kind of k, one of redistest.Leftovers.
func leftoverKind(k string) string {
	switch {
	case strings.HasSuffix(k, keys.LockSuffix):
		return leftLock
	case strings.HasSuffix(k, keys.LockSuffix+keys.RecordSuffix), strings.HasSuffix(k, keys.LockSuffix+keys.LogSuffix):
		return leftRecord
	case strings.HasSuffix(k, keys.LockSuffix+keys.ReceiptSuffix):
		return leftReceipt
	}
	return leftTemp
}

// leftovers returns the keys of a run under prefix (redistest.Leftovers:
// not the live keys, nor their generation records), with their PTTLs.
func leftovers(t testing.TB, c rueidis.Client, prefix string) []leftover {
	t.Helper()
	var out []leftover
	for _, k := range redistest.Leftovers(t, c, prefix) {
		ms, err := c.Do(context.Background(), c.B().Pttl().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatalf("PTTL %s: %v", k, err)
		}
		if ms == -2 {
			continue // expired since SCAN
		}
		d := time.Duration(ms) * time.Millisecond
		if ms < 0 {
			d = time.Duration(ms)
		}
		out = append(out, leftover{key: k, kind: leftoverKind(k), pttl: d})
	}
	return out
}

// deployment is where one case runs: the server that holds the case's slot,
// the proxy on the rebuild client's path to it, and how to make clients.
type deployment struct {
	name    string
	cluster bool                    // keys.Base of a cluster
	srv     *redistest.Server       // the server holding the case's keys
	proxy   *faultproxy.Proxy       // in front of srv, on the rebuild client's path
	stats   func() faultproxy.Stats // of every proxy on the rebuild client's path
	cutAll  func()                  // cuts every connection of every such proxy
	client  rueidis.Client          // the rebuild's client, through the proxy
	prefix  string
	observe func(tb testing.TB) rueidis.Client // a new client straight to the server(s)

	unordered bool // the faulted run sets rebuild.Options.Unordered
}

// allClosed reports an error while connections through d's proxies are
// open.
func (d *deployment) allClosed() error {
	if open := d.stats().Open; open > 0 {
		return fmt.Errorf("%d connections of the run still open through the proxy", open)
	}
	return nil
}

// rebuildClientOption is the rebuild client's configuration: no background
// PING (Dialer.KeepAlive -1), so that the only bytes through the proxy are
// the run's and a CutAfter budget counts them alone. Every Run is bounded
// by a ctx deadline (or, for the cancel fault, its cancel) instead.
func rebuildClientOption() rueidis.ClientOption {
	return rueidis.ClientOption{DisableCache: true, Dialer: net.Dialer{KeepAlive: -1}}
}

// standalone starts a private server (with args) behind a private proxy.
func standalone(t testing.TB, args ...string) *deployment {
	t.Helper()
	srv := redistest.OwnServer(t, args...)
	p, err := faultproxy.New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	opt := rebuildClientOption()
	opt.InitAddress = []string{p.Addr()}
	opt.ForceSingleClient = true
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &deployment{
		name: "standalone", srv: srv, proxy: p, stats: p.Stats, cutAll: p.CutAll, client: c,
		prefix:  redistest.Prefix(t),
		observe: srv.Client,
	}
}

// onCluster puts a private Dialer in front of cl. The case's keys share one
// hash tag; srv is the master of its slot. On a shared cluster every key of
// the case is deleted when it ends.
func onCluster(t testing.TB, cl *redistest.Cluster, shared bool) *deployment {
	t.Helper()
	d := &faultproxy.Dialer{}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	opt := rebuildClientOption()
	opt.InitAddress = cl.Addrs
	opt.DialCtxFn = d.Dial
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	prefix := "{" + redistest.Prefix(t) + "}"
	if shared {
		t.Cleanup(func() {
			obs := cl.Client(t)
			for _, k := range redistest.Keys(t, obs, prefix) {
				if err := obs.Do(context.Background(), obs.B().Del().Key(k).Build()).Error(); err != nil {
					t.Errorf("DEL %s: %v", k, err)
				}
			}
		})
	}
	srv := cl.NodeFor(t, prefix)
	p, err := d.Proxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	return &deployment{
		name: "cluster", cluster: true, srv: srv, proxy: p, stats: d.Stats, cutAll: d.CutAll, client: c,
		prefix: prefix, observe: cl.Client,
	}
}

// action is what the test goroutine decides at an injection point.
type action struct {
	// panicWith, if not nil, is panicked with by the hook, in place of the
	// intercepted command.
	panicWith any
	// after, if not nil, runs in the hook once the intercepted command has
	// returned (for instance: restart the killed server).
	after func() error
	// splitFirst, if not nil, makes the hook send the first command of an
	// intercepted DoMulti alone, call splitFirst, then send the rest.
	splitFirst func() error
	// then, if not nil, runs on the test goroutine while the run goes on
	// (for instance: cancel once the publish script is held in flight, or
	// let a successor run).
	then func()
}

// request is an injection point reached by the run.
type request struct {
	cmds  []rueidis.Completed // the intercepted command(s)
	reply chan action
}

// interceptor stops the run at its injection point, once, and hands
// control to the test goroutine, which injects the fault and answers with
// an action. It counts the write DoMultis and recognises the publish script.
type interceptor struct {
	at       point
	hooked   bool // false: the source injects the fault, the hook only counts
	publish  redistest.Script
	reqs     chan request
	abort    chan struct{} // closed when the test ends: never block then
	fired    atomic.Bool
	writes   atomic.Int64
	noScript atomic.Int64 // NOSCRIPT replies seen (rueidis falls back to EVAL for Do)
	afterErr chan error   // buffered: the first error of an after or splitFirst
	// heal, if set, is called once, after the next command that fails.
	heal atomic.Pointer[func()]
	// split is held by a split DoMulti while it is sent, and shared by
	// every other command of the run while it is sent.
	split sync.RWMutex
	// inflight counts the run's commands that have not returned yet;
	// returned is set once Run has returned, and late counts the commands
	// sent after that, lateCmd naming the first. A run must leave nothing
	// behind: no command in flight when Run returns, none sent later.
	inflight atomic.Int64
	returned atomic.Bool
	late     atomic.Int64
	lateCmd  atomic.Pointer[string]
}

// enter counts a command of the run as sent; call exit when it returns.
func (in *interceptor) enter(cmds []rueidis.Completed) {
	in.inflight.Add(1)
	if in.returned.Load() && in.late.Add(1) == 1 {
		name := strings.Join(cmds[0].Commands()[:min(2, len(cmds[0].Commands()))], " ")
		in.lateCmd.Store(&name)
	}
}

func (in *interceptor) exit() { in.inflight.Add(-1) }

// runReturned marks the run as returned and reports how many of its
// commands were still in flight.
func (in *interceptor) runReturned() (inflight int64) {
	in.returned.Store(true)
	return in.inflight.Load()
}

// lateCommands reports the commands sent after Run returned, and the first.
func (in *interceptor) lateCommands() (n int64, first string) {
	if p := in.lateCmd.Load(); p != nil {
		first = *p
	}
	return in.late.Load(), first
}

// healAfterFailure arms heal: the next command of the run that fails calls
// it, once, after it has returned.
func (in *interceptor) healAfterFailure(heal func()) { in.heal.Store(&heal) }

func newInterceptor(t testing.TB, at point) *interceptor {
	t.Helper()
	in := &interceptor{
		at:       at,
		publish:  redistest.ScriptNamed("publish"),
		reqs:     make(chan request),
		abort:    make(chan struct{}),
		afterErr: make(chan error, 1),
	}
	t.Cleanup(func() { close(in.abort) })
	return in
}

// isWrite reports whether multi is a batch's DoMulti: a write to a temp key
// (not the lease's EVALSHA, nor a cleanup's UNLINK or EXPIRE).
func isWrite(multi []rueidis.Completed) bool {
	for _, cmd := range multi {
		if args := cmd.Commands(); len(args) > 1 && !slices.Contains([]string{"EVALSHA", "UNLINK", "EXPIRE"}, args[0]) {
			if _, _, temp := store.ParseTempKey(args[1]); temp {
				return true
			}
		}
	}
	return false
}

func (in *interceptor) isPublish(cmd rueidis.Completed) bool {
	args := cmd.Commands()
	return in.publish.Is(args)
}

// wrap returns c with the interceptor's hook.
func (in *interceptor) wrap(c rueidis.Client) rueidis.Client {
	return rueidishook.WithHook(c, redistest.Hook{
		OnDoMulti: func(c rueidis.Client, ctx context.Context, multi ...rueidis.Completed) (res []rueidis.RedisResult) {
			in.enter(multi)
			defer in.exit()
			if isWrite(multi) {
				n := in.writes.Add(1)
				if in.hooked && ((in.at == atBefore && n == 1) || (in.at == atMid && n == faultMidDoMulti)) {
					in.intercept(multi, func() { res = c.DoMulti(ctx, multi...) }, func(between func() error) {
						// The first command (a MULTI) alone, the fault,
						// then the rest, while the run's other commands
						// wait: those of another round trip in flight
						// (Unordered) would otherwise be pipelined into
						// the open transaction ("MULTI calls can not be
						// nested"), which rueidis never does within a
						// DoMulti; and a cleanup step that failed could
						// heal the partition before the rest is sent,
						// which would then run outside the transaction
						// ("EXEC without MULTI").
						in.split.Lock()
						defer in.split.Unlock()
						res = []rueidis.RedisResult{c.Do(ctx, multi[0])}
						in.report(between())
						res = append(res, c.DoMulti(ctx, multi[1:]...)...)
					})
					return res
				}
			}
			// A batch's transaction carries an EXPIRE NX of each temp
			// key it writes: that is no cleanup step.
			txn := slices.ContainsFunc(multi, func(cmd rueidis.Completed) bool { return cmd.Commands()[0] == "MULTI" })
			cleanup := make([]bool, len(multi))
			for i, cmd := range multi {
				cleanup[i] = !txn && isCleanup(cmd)
			}
			in.split.RLock()
			res = c.DoMulti(ctx, multi...)
			in.split.RUnlock()
			for i, r := range res {
				in.countNoScript(r)
				in.failed(cleanup[i], r.Error())
			}
			return res
		},
		OnDo: func(c rueidis.Client, ctx context.Context, cmd rueidis.Completed) (res rueidis.RedisResult) {
			in.enter([]rueidis.Completed{cmd})
			defer in.exit()
			if in.hooked && in.at == atPublish && in.isPublish(cmd) {
				in.intercept([]rueidis.Completed{cmd}, func() { res = c.Do(ctx, cmd) }, nil)
			} else {
				cleanup := isCleanup(cmd)
				in.split.RLock()
				res = c.Do(ctx, cmd)
				in.split.RUnlock()
				in.failed(cleanup, res.Error())
			}
			in.countNoScript(res)
			return res
		},
	})
}

// isCleanup reports whether cmd, sent outside a transaction, is a step of a
// failed run's cleanup: the UNLINK that discards a temp key, or the EXPIRE
// that preserves one. Call it before cmd is sent: rueidis recycles a
// command once it has run.
func isCleanup(cmd rueidis.Completed) bool {
	args := cmd.Commands()
	if (args[0] != "UNLINK" && args[0] != "EXPIRE") || len(args) < 2 {
		return false
	}
	_, _, temp := store.ParseTempKey(args[1])
	return temp
}

// failed calls the armed heal if a cleanup step failed: with a network
// error, or with its deadline (rueidis may wait for a cluster refresh that
// the partition keeps failing).
func (in *interceptor) failed(cleanup bool, err error) {
	if !cleanup || (!isNetwork(err) && !errors.Is(err, context.DeadlineExceeded)) {
		return
	}
	if h := in.heal.Swap(nil); h != nil {
		(*h)()
	}
}

// report keeps err, if it is the first error of the fault's own steps.
func (in *interceptor) report(err error) {
	if err != nil {
		select {
		case in.afterErr <- err:
		default:
		}
	}
}

func (in *interceptor) countNoScript(r rueidis.RedisResult) {
	if rerr, ok := rueidis.IsRedisErr(r.Error()); ok && rerr.IsNoScript() {
		in.noScript.Add(1)
	}
}

// intercept runs pass, the intercepted command, under the action the test
// goroutine chooses; only the first call of a run intercepts. split, if not
// nil, passes a DoMulti on in two parts, calling between in between.
func (in *interceptor) intercept(cmds []rueidis.Completed, pass func(), split func(between func() error)) {
	if !in.fired.CompareAndSwap(false, true) {
		pass()
		return
	}
	req := request{cmds: cmds, reply: make(chan action, 1)}
	var a action
	select {
	case in.reqs <- req:
		select {
		case a = <-req.reply:
		case <-in.abort:
		}
	case <-in.abort:
	}
	if a.panicWith != nil {
		panic(a.panicWith)
	}
	if a.splitFirst != nil && split != nil {
		split(a.splitFirst)
	} else {
		pass()
	}
	if a.after != nil {
		in.report(a.after())
	}
}

// reader watches the live keys of a case while it runs, through its own
// client straight to the server, and counts the reads that saw a gap: the
// hash or sorted set missing or partial, no bucket at all, or buckets of
// two data sets at once. Each read is one read-only script, so it sees one
// instant. Failed reads (a paused, killed or loading server) are not gaps.
type reader struct {
	stop        chan struct{}
	done        chan struct{}
	reads, gaps atomic.Int64
	mu          sync.Mutex
	firstGap    string
}

var readScript = rueidis.NewLuaScriptReadOnly(`
local out = {redis.call('HLEN', KEYS[1]), redis.call('ZCARD', KEYS[2])}
for i = 3, #KEYS do out[#out + 1] = redis.call('EXISTS', KEYS[i]) end
return out`)

func startReader(c rueidis.Client, s shape) *reader {
	r := &reader{stop: make(chan struct{}), done: make(chan struct{})}
	watched := []string{s.email, s.score}
	var sets []dataset
	for _, d := range []dataset{v1, v2, v3} {
		for _, cc := range countries[d] {
			watched = append(watched, s.country+":"+cc)
			sets = append(sets, d)
		}
	}
	go func() {
		defer close(r.done)
		// One read a millisecond at most: dense enough to see any window,
		// without taking the CPU from the run it watches.
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			got, err := readScript.Exec(ctx, c, watched, nil).AsIntSlice()
			cancel()
			if err != nil {
				continue
			}
			r.reads.Add(1)
			seen := map[dataset]bool{}
			for i, d := range sets {
				if got[2+i] == 1 {
					seen[d] = true
				}
			}
			if got[0] != faultItems || got[1] != faultItems || len(seen) != 1 {
				r.gaps.Add(1)
				r.mu.Lock()
				if r.firstGap == "" {
					r.firstGap = fmt.Sprintf("HLEN %d, ZCARD %d, buckets of %v", got[0], got[1], sortedKeys(mapKeysString(seen)))
				}
				r.mu.Unlock()
			}
		}
	}()
	return r
}

func mapKeysString(m map[dataset]bool) map[string]bool {
	out := map[string]bool{}
	for d := range m {
		out[d.String()] = true
	}
	return out
}

func (r *reader) finish() (reads, gaps int64, first string) {
	close(r.stop)
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reads.Load(), r.gaps.Load(), r.firstGap
}

// errClass names the cause a run's error carries, as errors.Is and
// errors.As see it.
func errClass(err error, panicked any) string {
	var rerr *rueidis.RedisError
	switch {
	case panicked != nil:
		return "panic"
	case err == nil:
		return "nil"
	case errors.Is(err, rebuild.ErrLockLost):
		return "ErrLockLost"
	case errors.Is(err, rebuild.ErrTempKeyLost):
		return "ErrTempKeyLost"
	case errors.Is(err, rebuild.ErrInProgress):
		return "ErrInProgress"
	case errors.Is(err, context.Canceled):
		return "context.Canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "context.DeadlineExceeded"
	case errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "OOM"):
		return "OOM"
	case isNetwork(err):
		return "network"
	}
	return "other"
}

// isNetwork reports whether err is a transport failure: a *net.OpError, or
// the EOF, reset or broken pipe a cut connection reads as.
func isNetwork(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// errOp returns the Op of err's *rebuild.Error, if any.
func errOp(err error) string {
	var e *rebuild.Error
	if errors.As(err, &e) {
		return e.Op
	}
	return ""
}

// row is one line of the fault report.
type row struct {
	deployment, fault, point string
	outcome                  string
	class, op                string
	live                     string
	temps                    int           // temp keys left once the fault is over
	tempMaxTTL               time.Duration // their largest PTTL
	tempsNoTTL               int           // those without a TTL
	locks                    int           // locks left once the run returned
	locksPastTTL             int           // locks seen TTL after the run returned
	records                  int           // records and logs of locks left once the fault was over
	recordsPastTTL           int           // those seen TTL after the fault was over
	receipts                 int           // receipts left once the fault was over
	receiptMaxTTL            time.Duration // their largest PTTL
	reads, gaps              int64
	noScript                 int64
	elapsed                  time.Duration
	bad                      []string // broken invariants: lost data, gaps, stale publishes, leaks, generation records
}

// report collects the rows of every case.
var report struct {
	mu   sync.Mutex
	rows []row
}

func addRow(r row) {
	report.mu.Lock()
	defer report.mu.Unlock()
	report.rows = append(report.rows, r)
}

// markdown renders rows as the RELIABILITY.md table, and the totals.
func markdown(rows []row) string {
	slices.SortFunc(rows, func(a, b row) int {
		return cmp.Or(cmp.Compare(faultOrder(a.fault), faultOrder(b.fault)), cmp.Compare(a.fault, b.fault),
			cmp.Compare(a.deployment, b.deployment), cmp.Compare(pointOrder(a.point), pointOrder(b.point)))
	})
	var b strings.Builder
	b.WriteString("| fault | point | deployment | outcome | error (class, op) | live keys | temps left (TTL) | locks (records) left / past TTL | receipts left (TTL) | reader gaps / reads | time |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	var lost, gaps, stale, leaks, gens, broken int
	for _, r := range rows {
		e := r.class
		if r.op != "" {
			e += ", " + r.op
		}
		temps := "0"
		switch {
		case r.tempsNoTTL > 0:
			temps = fmt.Sprintf("%d, **%d without TTL**", r.temps, r.tempsNoTTL)
		case r.temps > 0:
			temps = fmt.Sprintf("%d (≤ %.1fs)", r.temps, r.tempMaxTTL.Seconds())
		}
		receipts := "0"
		if r.receipts > 0 {
			receipts = fmt.Sprintf("%d (≤ %.1fs)", r.receipts, r.receiptMaxTTL.Seconds())
		}
		outcome := r.outcome
		if r.noScript > 0 {
			outcome += fmt.Sprintf(" (%d NOSCRIPT, recovered)", r.noScript)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %d (%d) / %d (%d) | %s | %d / %d | %.1fs |\n",
			r.fault, r.point, r.deployment, outcome, e, r.live, temps, r.locks, r.records, r.locksPastTTL, r.recordsPastTTL,
			receipts, r.gaps, r.reads, r.elapsed.Seconds())
		for _, x := range r.bad {
			switch {
			case strings.HasPrefix(x, "lost"):
				lost++
			case strings.HasPrefix(x, "gap"):
				gaps++
			case strings.HasPrefix(x, "stale"):
				stale++
			case strings.HasPrefix(x, "leak"):
				leaks++
			case strings.HasPrefix(x, "generation"):
				gens++
			}
		}
		if len(r.bad) > 0 {
			broken++
		}
	}
	fmt.Fprintf(&b, "\nCases: %d. Lost data: %d. Gaps: %d. Stale publishes: %d. Leaks (keys or commands): %d. Wrong generation records: %d. Cases with a broken invariant: %d.\n",
		len(rows), lost, gaps, stale, leaks, gens, broken)
	for _, r := range rows {
		for _, x := range r.bad {
			fmt.Fprintf(&b, "\n- %s / %s / %s: %s\n", r.fault, r.point, r.deployment, x)
		}
	}
	return b.String()
}

func faultOrder(f string) int {
	for i, g := range faultNames {
		if strings.HasPrefix(f, g) {
			return i
		}
	}
	return len(faultNames)
}

func pointOrder(p string) int {
	for i, q := range []point{atBefore, atMid, atPublish} {
		if q.String() == p {
			return i
		}
	}
	return 3
}

// lockedBuffer is a bytes.Buffer safe for concurrent use: a run's Logger,
// a helper process's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// caseT is the testing.TB of a case that runs in a goroutine of its own,
// beside other such cases, inside one subtest. The faults that hold a run
// past its TTL (a stall, a SIGSTOP) leave it waiting for seconds; as
// parallel subtests each would hold one of the -parallel slots (GOMAXPROCS:
// 2 here) while it waits. Its Fatal methods end the case's goroutine, as
// they end a test's; its messages and its Name carry the case's name.
type caseT struct {
	testing.TB
	name string
	gate chan struct{} // a slot of it is held while the case is busy
	held bool
}

// busy takes a slot of the gate; idle gives it back, once.
func (c *caseT) busy() { c.gate <- struct{}{}; c.held = true }

func (c *caseT) idle() {
	if c.held {
		c.held = false
		<-c.gate
	}
}

func (c *caseT) Name() string { return c.name }

func (c *caseT) Log(args ...any) { c.TB.Helper(); c.TB.Log(append([]any{c.name + ":"}, args...)...) }

func (c *caseT) Logf(format string, args ...any) {
	c.TB.Helper()
	c.TB.Logf("%s: %s", c.name, fmt.Sprintf(format, args...))
}

func (c *caseT) Error(args ...any) {
	c.TB.Helper()
	c.TB.Error(append([]any{c.name + ":"}, args...)...)
}

func (c *caseT) Errorf(format string, args ...any) {
	c.TB.Helper()
	c.TB.Errorf("%s: %s", c.name, fmt.Sprintf(format, args...))
}

func (c *caseT) Fatal(args ...any) { c.TB.Helper(); c.Error(args...); c.FailNow() }

func (c *caseT) Fatalf(format string, args ...any) {
	c.TB.Helper()
	c.Errorf(format, args...)
	c.FailNow()
}

// FailNow marks the test failed and ends the case's goroutine.
func (c *caseT) FailNow() { c.TB.Fail(); runtime.Goexit() }

// poll calls f until it returns nil or faultWait passes, and returns f's
// last error.
func poll(f func() error) error { return pollFor(faultWait, f) }

// pollFor calls f until it returns nil or dur has passed, and returns its
// last error.
func pollFor(dur time.Duration, f func() error) error {
	deadline := time.Now().Add(dur)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}
