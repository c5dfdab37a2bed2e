package reader

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// DefaultCacheTTL is the client-side cache TTL of a pointer when
// [Options.CacheTTL] is zero.
const DefaultCacheTTL = 5 * time.Second

// ErrBadPointer reports that an index's pointer holds something other than
// a generation: a positive decimal number without sign, spaces or leading
// zeros, as the writer sets it. On a cluster, where two live keys share a
// pointer (X and "{X}", SPEC C104), it also reports that the owner stamp
// that says whose the pointer is, "<base>:rebuild-owner", is absent while
// the pointer is set, is not a string, or names neither key: the error
// names the stamp and how to write it. The reader does not guess: it
// refuses to read the index until the pointer, or its stamp, is repaired.
var ErrBadPointer = errors.New("pointer holds no generation")

// Error is the error type of a [Reader]'s methods. Op names the step that
// failed ("new", "resolve", "recheck", or the read, such as "hget"), Key
// the key it was working on (the pointer, or the owner stamp beside it,
// when resolving; the data key when reading), and Err the cause: [ErrBadPointer], [ErrGroupConflict], a Redis
// or transport error, or a description of bad options.
type Error struct {
	Op  string
	Key string
	Err error
}

func (e *Error) Error() string {
	if e.Key == "" {
		return "keyswap: reader: " + e.Op + ": " + e.Err.Error()
	}
	return "keyswap: reader: " + e.Op + " " + e.Key + ": " + e.Err.Error()
}

// Unwrap returns e.Err.
func (e *Error) Unwrap() error { return e.Err }

// Options configures a [Reader]. The zero value is ready to use.
type Options struct {
	// CacheTTL is how long a pointer may be served from the client-side
	// cache: the TTL given to DoCache, and the worst-case staleness of a
	// reader whose invalidation was lost. Zero means DefaultCacheTTL (5 s).
	// The writer's grace period (rebuild.Options.Grace, default 10 s) must
	// exceed the CacheTTL of every reader, or a reader may find the
	// generation it still uses removed (the typed reads then recheck the
	// pointer, at one more round trip). Negative is an error.
	CacheTTL time.Duration
	// Group is the group of the indexes the reader reads, as the writer
	// names it (rebuild.Options.Group): their pointers hang off
	// "{" + Group + "}:rebuild-group:" + the index's key. A reader reads the indexes of
	// one group, or those of no group when Group is empty. A reader
	// without the group reads the index's pointer without a group, which
	// the group's first run set to "group:" + Group: it fails with an
	// error matching ErrGroupConflict naming the group, never reading the
	// keys in the rename-in-place shape. A reader in another group finds
	// no pointer of its group; it then reads the pointer without a group
	// too (through the cache, as the first) and fails on the claim of
	// another group the same way; with no claim there, it reads those
	// keys. A group with a '{' or '}' is an error matching ErrBadGroup.
	Group string
}

// ErrGroupConflict reports that an index is in a group the reader does not
// read: the pointer the reader reads (that of the index without a group)
// holds "group:" + the group, left by the first run of the index in that
// group. The index's data is behind the group's pointer: read it with
// Options.Group set to the group the error names. rebuild.ErrGroupConflict
// is the same error.
var ErrGroupConflict = keys.ErrGroupConflict

// ErrBadGroup reports an Options.Group that cannot be a group: one holding
// a '{' or '}'. rebuild.New's error for such an Options.Group, or for a
// Group in RenameInPlace mode, matches it too.
var ErrBadGroup = keys.ErrBadGroup

// Reader finds and reads the current data keys of indexes. It is safe for
// concurrent use. Create it with [New].
type Reader struct {
	client  rueidis.Client
	cluster keys.Names // the shapes of the pointers, and their group
	ttl     time.Duration
	cached  atomic.Int32 // cacheUnknown, cacheOn or cacheOff
	// noMulti is set once the server refused the MULTI of a cached read:
	// resolves then send a plain GET rather than fail over on each one.
	noMulti atomic.Bool

	// overrides holds, by pointer key (overrideKey), the generations that
	// rechecks read from the server where the cache holds a stale one;
	// nOverrides is its length, read without mu on the way of every
	// resolve, and rechecks counts the rechecks, so that an older one
	// never replaces a newer one's override.
	mu         sync.Mutex
	overrides  map[string]override
	nOverrides atomic.Int32
	rechecks   int64
}

// override corrects one cached reply of a pointer that a recheck found
// stale (an invalidation lost, or not yet received): while the cache
// serves that reply, resolves use fresh instead of stale. A cache entry is
// told from another by its expiry time (CachePXAT, set when it is filled),
// so an override ends when the cache catches up (an invalidation, or the
// entry's TTL) and never lasts longer than the entry it corrects. Where
// the owner stamp is read with the pointer, the reply is the pair, and a
// new entry of either ends the override.
type override struct {
	at           cacheAt // the cache entries of the reply it corrects
	stale, fresh int64   // the generations the reply and the server name
	seq          int64   // the recheck that made it
}

const (
	cacheUnknown = iota
	cacheOn
	cacheOff
)

// New returns a Reader that reads through client. Key shapes follow
// client.Mode(), as the writer's do: the pointer hangs off the index's key
// on a standalone server (and through a sentinel), and off a key in the
// index's slot on a cluster, or off the group's tag (Options.Group). New
// sends nothing; it fails on a nil client, a negative CacheTTL or a bad
// Group.
func New(client rueidis.Client, opts Options) (*Reader, error) {
	if client == nil {
		return nil, &Error{Op: "new", Err: errors.New("nil rueidis.Client")}
	}
	if opts.CacheTTL < 0 {
		return nil, &Error{Op: "new", Err: fmt.Errorf("negative Options.CacheTTL %v", opts.CacheTTL)}
	}
	if opts.Group != "" {
		if err := keys.CheckGroup(opts.Group); err != nil {
			return nil, &Error{Op: "new", Err: err}
		}
	}
	ttl := opts.CacheTTL
	if ttl == 0 {
		ttl = DefaultCacheTTL
	}
	return &Reader{client: client, cluster: keys.Names{Cluster: client.Mode() == rueidis.ClientModeCluster, Group: opts.Group}, ttl: ttl}, nil
}

// Cached reports whether the reader's last resolve of a pointer went
// through rueidis's client-side cache: true on a RESP3 client with client
// tracking (rueidis's default), false on a client created with
// DisableCache (miniredis, AlwaysRESP2), whose every resolve is a GET, one
// round trip. Before the first resolve it reports false.
func (r *Reader) Cached() bool { return r.cached.Load() == cacheOn }

// CacheTTL returns the client-side cache TTL of the reader's pointers.
func (r *Reader) CacheTTL() time.Duration { return r.ttl }

// Ref names the key of an index that a read targets: the live key of a
// plain index ([Plain]) or a bucket of a family ([InBucket]).
type Ref struct {
	name   string // the live key, or the family's prefix
	bucket string
	family bool
}

// Plain returns the Ref of the index whose live key is live (a hash,
// a sorted set or a set rebuilt as one key).
func Plain(live string) Ref { return Ref{name: live} }

// InBucket returns the Ref of bucket of the family whose prefix is prefix,
// as passed to builders.SetIndex: "<prefix>:<bucket>" in the
// rename-in-place shape.
func InBucket(prefix, bucket string) Ref { return Ref{name: prefix, bucket: bucket, family: true} }

// String returns the key ref names in the rename-in-place shape.
func (ref Ref) String() string { return ref.key(0) }

// key returns ref's data key in generation gen, or in the
// rename-in-place shape when gen is 0 (no pointer).
func (ref Ref) key(gen int64) string {
	switch {
	case gen == 0 && ref.family:
		return ref.name + ":" + ref.bucket
	case gen == 0:
		return ref.name
	case ref.family:
		return keys.GenBucketKey(ref.name, gen, ref.bucket)
	default:
		return keys.GenKey(ref.name, gen)
	}
}

// Key returns the key that holds the data of the plain index whose live key
// is live: live itself when the index has no pointer, else live's key in
// the current generation. Once the pointer is cached it costs no round
// trip.
func (r *Reader) Key(ctx context.Context, live string) (string, error) {
	return r.Resolve(ctx, Plain(live))
}

// Bucket returns the key that holds bucket of the family whose prefix is
// prefix: "<prefix>:<bucket>" when the family has no pointer, else the
// bucket's key in the current generation. Once the pointer is cached it
// costs no round trip.
func (r *Reader) Bucket(ctx context.Context, prefix, bucket string) (string, error) {
	return r.Resolve(ctx, InBucket(prefix, bucket))
}

// Resolve returns the key that holds ref's data now, reading the pointer
// through the client-side cache.
func (r *Reader) Resolve(ctx context.Context, ref Ref) (string, error) {
	gen, err := r.generation(ctx, ref)
	if err != nil {
		return "", err
	}
	return ref.key(gen), nil
}

// Recheck reads ref's pointer without the cache and returns the key that
// holds ref's data now, and whether it differs from key, the key a read
// found missing. Call it when a key from [Reader.Key], [Reader.Bucket] or
// [Reader.Resolve] is missing, and read again when changed is true: the
// cached generation may have been removed after a flip the cache missed.
// When the cached pointer is stale, the reader's later resolves of ref
// return the generation Recheck read, until the cache drops its stale
// reply (an invalidation, or the end of its TTL). It costs one round trip.
func (r *Reader) Recheck(ctx context.Context, ref Ref, key string) (now string, changed bool, err error) {
	gen, err := r.recheck(ctx, ref)
	if err == nil && gen == 0 && r.cluster.Group != "" {
		own := keys.PointerKey(ref.name, keys.Names{Cluster: r.cluster.Cluster})
		err = r.otherGroup("recheck", own, r.client.Do(ctx, r.client.B().Get().Key(own).Build()))
	}
	if err != nil {
		return "", false, err
	}
	now = ref.key(gen)
	return now, now != key, nil
}

// recheck returns the generation ref's pointer names on the server, read
// without the cache (with the owner stamp of its base where stamped says
// so, in the same round trip). When the cache serves a reply that names
// another generation, the reply is stale, and later resolves use the
// server's generation instead until the cache drops that reply: a read
// that found the stale generation's data missing does not make every
// later read find it missing too.
func (r *Reader) recheck(ctx context.Context, ref Ref) (int64, error) {
	ptr, stamp := keys.PointerKey(ref.name, r.cluster), ""
	if r.stamped(ref.name) {
		stamp = stampOf(ptr)
	}
	r.mu.Lock()
	r.rechecks++
	seq := r.rechecks
	r.mu.Unlock()
	// The cached reply first, then the server's: the cached one is then
	// no newer than the server's. While the entry is cached (as right
	// after the resolve of a read) this costs no round trip.
	var at cacheAt
	var stale int64
	b := r.client.B()
	if r.cached.Load() == cacheOn && !r.noMulti.Load() {
		var g int64
		var err error
		if stamp != "" {
			res := r.client.DoMultiCache(ctx, rueidis.CT(b.Get().Key(ptr).Cache(), r.ttl), rueidis.CT(b.Get().Key(stamp).Cache(), r.ttl))
			g, err = owned(res[0], res[1], "recheck", ref.name, ptr, stamp)
			at = cacheAt{res[0].CachePXAT(), res[1].CachePXAT()}
		} else {
			res := r.client.DoCache(ctx, b.Get().Key(ptr).Cache(), r.ttl)
			g, err = parse(res, "recheck", ptr)
			at = cacheAt{res.CachePXAT(), 1}
		}
		if err == nil {
			stale = g
		} else {
			at = cacheAt{}
		}
	}
	var gen int64
	var err error
	if stamp != "" {
		res := r.client.DoMulti(ctx, b.Get().Key(ptr).Build(), b.Get().Key(stamp).Build())
		gen, err = owned(res[0], res[1], "recheck", ref.name, ptr, stamp)
	} else {
		gen, err = parse(r.client.Do(ctx, b.Get().Key(ptr).Build()), "recheck", ptr)
	}
	if err != nil || !at.cached() {
		return gen, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	key := overrideKey(ptr, stamp, ref.name)
	if o, ok := r.overrides[key]; ok && o.seq > seq {
		return gen, nil // a later recheck's
	}
	if r.overrides == nil {
		r.overrides = map[string]override{}
	}
	// When the server names the cached generation (a flip back that the
	// cache missed too), the override is kept all the same, naming that
	// generation: an earlier recheck still on its way cannot replace it.
	r.overrides[key] = override{at: at, stale: stale, fresh: gen, seq: seq}
	r.nOverrides.Store(int32(len(r.overrides)))
	return gen, nil
}

// overrideKey returns the key in Reader.overrides of the pointer ptr read
// for the index name: ptr itself, or, where the owner stamp stamp is read
// with it, ptr and name, since the indexes that share a pointer resolve
// it to different generations (the plain key of the one the stamp does
// not name).
func overrideKey(ptr, stamp, name string) string {
	if stamp == "" {
		return ptr
	}
	return ptr + "\x00" + name
}

// corrected returns gen, the generation of ptr (and stamp, "" where none
// is read) for the index name in the cached reply at, or the server's
// generation where a recheck found that reply stale.
func (r *Reader) corrected(ptr, stamp, name string, at cacheAt, gen int64) int64 {
	if r.nOverrides.Load() == 0 {
		return gen
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	key := overrideKey(ptr, stamp, name)
	o, ok := r.overrides[key]
	if !ok {
		return gen
	}
	if o.at == at && o.stale == gen {
		return o.fresh
	}
	// The cache caught up: the reply it corrected is gone.
	delete(r.overrides, key)
	r.nOverrides.Store(int32(len(r.overrides)))
	return gen
}

// generation returns the generation ref's pointer names, 0 when there is
// none, reading it through the client-side cache. A reader in a group that
// finds no pointer of the group reads the pointer without a group too (a
// cache hit after the first read): another group's claim there fails it
// with ErrGroupConflict naming that group (SPEC C102), since the plain
// keys it would read are nobody's. Where another live key can share ref's
// pointer (stamped), the owner stamp of its base is read with it, in the
// same round trip and the same cache, and decides whose it is (owned).
func (r *Reader) generation(ctx context.Context, ref Ref) (int64, error) {
	ptr, stamp := keys.PointerKey(ref.name, r.cluster), ""
	var gen int64
	var err error
	var at cacheAt
	if r.stamped(ref.name) {
		stamp = stampOf(ptr)
		pres, sres := r.getStamped(ctx, ptr, stamp)
		gen, err = owned(pres, sres, "resolve", ref.name, ptr, stamp)
		at = cacheAt{pres.CachePXAT(), sres.CachePXAT()}
	} else {
		res := r.get(ctx, ptr)
		gen, err = parse(res, "resolve", ptr)
		at = cacheAt{res.CachePXAT(), 1}
	}
	if err == nil && at.cached() {
		gen = r.corrected(ptr, stamp, ref.name, at, gen)
	}
	if err == nil && gen == 0 && r.cluster.Group != "" {
		own := keys.PointerKey(ref.name, keys.Names{Cluster: r.cluster.Cluster})
		err = r.otherGroup("resolve", own, r.get(ctx, own))
	}
	return gen, err
}

// cacheAt tells one cached reply of a pointer from another: the expiry
// times (CachePXAT) of the cache entries of the pointer and of the owner
// stamp read with it (1 where none is read). A value is 0 for a reply that
// did not come through the cache.
type cacheAt [2]int64

// cached reports whether both replies came through the cache.
func (at cacheAt) cached() bool { return at[0] > 0 && at[1] > 0 }

// get reads ptr through the client-side cache, or without it when the
// server refuses the MULTI of a cached read.
func (r *Reader) get(ctx context.Context, ptr string) rueidis.RedisResult {
	if r.noMulti.Load() {
		return r.client.Do(ctx, r.client.B().Get().Key(ptr).Build())
	}
	res := r.client.DoCache(ctx, r.client.B().Get().Key(ptr).Cache(), r.ttl)
	if r.aborted(res) {
		return r.client.Do(ctx, r.client.B().Get().Key(ptr).Build())
	}
	r.note(res)
	return res
}

// aborted reports whether the server refused the MULTI that wraps a cached
// read (a renamed or denied MULTI, say) in one of res; the reader then
// reads without the cache, from now on.
func (r *Reader) aborted(res ...rueidis.RedisResult) bool {
	for _, one := range res {
		if errors.Is(one.Error(), rueidis.ErrDoCacheAborted) {
			r.noMulti.Store(true)
			r.cached.Store(cacheOff)
			return true
		}
	}
	return false
}

// note records whether res, a reply to a read through the cache, came
// through it. A cached reply (hit or miss) carries the time its cache
// entry expires; rueidis's DoCache on a client without a cache sends a
// plain GET, whose reply carries none.
func (r *Reader) note(res rueidis.RedisResult) {
	if err := res.Error(); err != nil && !rueidis.IsRedisNil(err) {
		return
	}
	if res.CachePXAT() > 0 {
		r.cached.Store(cacheOn)
	} else {
		r.cached.Store(cacheOff)
	}
}

// otherGroup returns an error matching ErrGroupConflict when res, the
// reply to a GET of ptr, the pointer without a group of an index whose
// pointer in r's group is absent, holds the claim of another group.
func (r *Reader) otherGroup(op, ptr string, res rueidis.RedisResult) error {
	v, err := res.ToString()
	if rueidis.IsRedisNil(err) {
		return nil
	}
	if err != nil {
		return &Error{Op: op, Key: ptr, Err: err}
	}
	if group, ok := keys.ParseGroupMarker(v); ok && group != r.cluster.Group {
		return &Error{Op: op, Key: ptr, Err: fmt.Errorf("%w: the index is in group %s (%s holds %s), not %s: read it with Options.Group %s", ErrGroupConflict, quote(group), ptr, quote(v), quote(r.cluster.Group), quote(group))}
	}
	return nil
}

// parse returns the generation in res, a reply to a GET of the pointer
// ptr: 0 when there is none, an *Error of op when the GET failed or the
// pointer holds no generation.
func parse(res rueidis.RedisResult, op, ptr string) (int64, error) {
	v, err := res.ToString()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	if err != nil {
		return 0, &Error{Op: op, Key: ptr, Err: err}
	}
	if group, ok := keys.ParseGroupMarker(v); ok {
		// A group's claim (SPEC C102): the index's generations are the
		// group's, behind another pointer.
		return 0, &Error{Op: op, Key: ptr, Err: fmt.Errorf("%w: the index is in group %s (%s holds %s): read it with Options.Group %s", ErrGroupConflict, quote(group), ptr, quote(v), quote(group))}
	}
	gen, ok := parseGeneration(v)
	if !ok {
		return 0, &Error{Op: op, Key: ptr, Err: fmt.Errorf("%w: %s", ErrBadPointer, quote(v))}
	}
	return gen, nil
}

// parseGeneration parses a generation as the writer sets it: a positive
// decimal number, without sign, spaces or leading zeros, that fits an
// int64.
func parseGeneration(v string) (int64, bool) {
	if v == "" || v[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
	}
	gen, err := strconv.ParseInt(v, 10, 64)
	return gen, err == nil
}

// maxQuoted is how many bytes of an untrusted value an error quotes.
const maxQuoted = 64

// quote quotes v for an error, shortened to maxQuoted bytes.
func quote(v string) string {
	if len(v) > maxQuoted {
		return fmt.Sprintf("%q... (%d bytes)", v[:maxQuoted], len(v))
	}
	return strconv.Quote(v)
}
