package gens

import (
	"context"
	"crypto/fips140"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// Kind is the kind of a generation's state.
type Kind int

// The kinds of state a generation can be in; see the package documentation.
const (
	Building Kind = iota + 1
	Current
	Previous
	Retired
)

// String returns the kind's name as the registry spells it, without its
// argument.
func (k Kind) String() string {
	switch k {
	case Building:
		return "building"
	case Current:
		return keys.RegCurrent
	case Previous:
		return keys.RegPrevious
	case Retired:
		return "retired"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// State is the parsed state of one generation.
type State struct {
	Kind Kind
	// Token is the lock token of the run that builds the generation
	// (Building only).
	Token string
	// RetiredAt is when the generation was flipped away from, to the
	// millisecond (Retired only).
	RetiredAt time.Time
	// Raw is the field's value as the registry holds it.
	Raw string
}

// String returns the state as the registry holds it.
func (s State) String() string { return s.Raw }

// ParseState parses a generation's state, as the registry holds it.
func ParseState(v string) (State, error) {
	switch {
	case v == keys.RegCurrent:
		return State{Kind: Current, Raw: v}, nil
	case v == keys.RegPrevious:
		return State{Kind: Previous, Raw: v}, nil
	case strings.HasPrefix(v, keys.RegBuilding):
		token := v[len(keys.RegBuilding):]
		if token == "" {
			return State{}, errors.New("a building state without a token")
		}
		return State{Kind: Building, Token: token, Raw: v}, nil
	case strings.HasPrefix(v, keys.RegRetired):
		ms, ok := canonical(v[len(keys.RegRetired):], 0)
		if !ok {
			return State{}, errors.New("a retired state whose time is not milliseconds in canonical decimal")
		}
		return State{Kind: Retired, RetiredAt: time.UnixMilli(ms), Raw: v}, nil
	}
	return State{}, errors.New("an unknown state (want building:<token>, current, previous or retired:<unix ms>)")
}

// canonical parses s as a decimal int64 of at least min, written as
// strconv.FormatInt writes it: no sign, no leading zero, no space. The
// registry's fields name keys (keys.GenKey formats the number), so "07"
// would name a generation whose keys end in "7" but whose field HDEL "7"
// would never remove.
func canonical(s string, min int64) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < min || strconv.FormatInt(n, 10) != s {
		return 0, false
	}
	return n, true
}

// ErrCorrupt reports that an index's registry of generations, its pointer
// or its lock holds what no keyswap run writes (a value, or a type). [Read] returns it in a
// [*CorruptError], which names the key, the field and the value.
var ErrCorrupt = errors.New("holds what keyswap does not write")

// CorruptError is an index's registry, pointer or lock that holds what no
// run writes: it names the key, the field (none but the registry's) and
// the value.
type CorruptError struct {
	// Key is the registry's, the pointer's or the lock's Redis key.
	Key string
	// Field is the registry's field ("" for another key, or for a key of
	// the wrong type).
	Field string
	// Value is the value found, or the type of a key of the wrong type.
	Value string
	// Problem says what is wrong with it.
	Problem string
}

func (e *CorruptError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s %s: %q is %s", e.Key, ErrCorrupt, e.Value, e.Problem)
	}
	return fmt.Sprintf("%s %s: field %q = %q is %s", e.Key, ErrCorrupt, e.Field, e.Value, e.Problem)
}

// Unwrap returns [ErrCorrupt].
func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// Registry is the parsed registry of generations of one index.
type Registry struct {
	// Key is the registry's Redis key.
	Key string
	// Next is the last generation allocated (0: none, or no registry).
	Next int64
	// Gens holds the state of every generation present.
	Gens map[int64]State
}

// Parse parses and checks the fields of the registry key (as HGETALL
// returns them; none when the key does not exist). A field other than
// "next" must be a generation from 1 to Next in canonical decimal, its
// value a state [ParseState] knows, and at most one generation may be
// current and one previous; otherwise Parse returns a [*CorruptError].
func Parse(key string, fields map[string]string) (Registry, error) {
	r := Registry{Key: key, Gens: map[int64]State{}}
	bad := func(f, v, problem string) error {
		return &CorruptError{Key: key, Field: f, Value: v, Problem: problem}
	}
	next, hasNext := fields[keys.RegNext]
	if hasNext {
		n, ok := canonical(next, 0)
		if !ok {
			return Registry{}, bad(keys.RegNext, next, "not a non-negative number in canonical decimal")
		}
		r.Next = n
	}
	first := map[Kind]string{}
	for _, f := range slices.Sorted(maps.Keys(fields)) {
		if f == keys.RegNext {
			continue
		}
		v := fields[f]
		g, ok := canonical(f, 1)
		if !ok {
			return Registry{}, bad(f, v, "neither "+keys.RegNext+" nor a generation (a positive number in canonical decimal)")
		}
		if !hasNext {
			return Registry{}, bad(f, v, "a generation in a registry without a "+keys.RegNext+" field")
		}
		if g > r.Next {
			return Registry{}, bad(f, v, fmt.Sprintf("a generation above %s (%d): never allocated", keys.RegNext, r.Next))
		}
		s, err := ParseState(v)
		if err != nil {
			return Registry{}, bad(f, v, err.Error())
		}
		if s.Kind == Current || s.Kind == Previous {
			if other, dup := first[s.Kind]; dup {
				return Registry{}, bad(f, v, fmt.Sprintf("a second %s generation (generation %s is %s too)", s.Kind, other, s.Kind))
			}
			first[s.Kind] = f
		}
		r.Gens[g] = s
	}
	return r, nil
}

// Sorted returns the generations present, in increasing order.
func (r Registry) Sorted() []int64 { return slices.Sorted(maps.Keys(r.Gens)) }

// Find returns the generation in state kind (Current or Previous) and
// whether there is one.
func (r Registry) Find(kind Kind) (int64, bool) {
	for _, g := range r.Sorted() {
		if r.Gens[g].Kind == kind {
			return g, true
		}
	}
	return 0, false
}

// Index names an index: a plain live key, or a family's prefix.
type Index struct {
	// Live is the live key, or the family's prefix (without the ':' that
	// separates it from a bucket).
	Live string
	// Family says Live is a family's prefix, whose buckets are
	// Live + ":" + bucket (keys.GenBucketKey in a generation).
	Family bool
	// Type is the Redis type of a family's buckets, as TYPE names it ("set"
	// for a SetIndex). [DropPlain] needs it: a family owns only the keys of
	// its type under its prefix. The sweep ignores it.
	Type string
	// Group is the group of the index (keys.Names), whose control keys
	// hang off the group's hash tag; empty for an index of its own.
	Group string
}

// names returns how the control keys of idx are named on client.
func (idx Index) names(client rueidis.Client) keys.Names {
	return keys.Names{Cluster: isCluster(client), Group: idx.Group}
}

// check returns an error when idx cannot name an index: an empty key, or
// one of keyswap's own keys (keys.Reserved), which no run rebuilds.
func (idx Index) check() error {
	switch {
	case idx.Live == "":
		return errors.New("empty key")
	case keys.Reserved(idx.Live):
		return fmt.Errorf("%q has the shape of one of keyswap's own keys, which is never an index", idx.Live)
	}
	return nil
}

// Snapshot is what [Read] reads of an index in one atomic step: its
// registry, its pointer and its lock.
type Snapshot struct {
	Registry Registry
	// PointerKey is the pointer's key; Pointer the generation it names,
	// when HasPointer.
	PointerKey string
	Pointer    int64
	HasPointer bool
	// InGroup is the group whose claim the pointer of an index read
	// without a group holds (keys.GroupMarker, SPEC C102); Read then
	// returns an error matching keys.ErrGroupConflict with the rest.
	InGroup string
	// LockKey is the lock's key; Lock its value, the token of the run
	// that holds it ("" when free).
	LockKey string
	Lock    string
	// Time is the server's clock when it read them (TIME), to the
	// microsecond: the clock the runs' scripts stamp retirements with.
	Time time.Time
}

// newScript returns a rueidis script. In FIPS 140 mode rueidis must not
// compute SHA-1 itself: it asks the server.
func newScript(src string, retryable bool) *rueidis.Lua {
	var opts []rueidis.LuaOption
	if fips140.Enabled() {
		opts = append(opts, rueidis.WithLoadSHA1(true))
	}
	if retryable {
		return rueidis.NewLuaScriptRetryable(src, opts...)
	}
	return rueidis.NewLuaScript(src, opts...)
}

// readScript reads a registry, a pointer and a lock, all in the index's
// slot, in one step: a flip between two reads would make a consistent pair
// look corrupt. It reads each only if it has the type keyswap gives it, and
// returns the types.
//
// KEYS[1] registry, KEYS[2] pointer, KEYS[3] lock.
// Returns {HGETALL registry, the pointer, the lock, TIME, and the three
// types}; an empty list or string for a key absent or of another type (a
// Lua false would reach a RESP3 client as a boolean, not a nil).
var readScript = newScript(`
local function typ(k) return redis.call('TYPE', k).ok end
local rt, pt, lt = typ(KEYS[1]), typ(KEYS[2]), typ(KEYS[3])
local fields, ptr, lock = {}, '', ''
if rt == 'hash' then fields = redis.call('HGETALL', KEYS[1]) end
if pt == 'string' then ptr = redis.call('GET', KEYS[2]) end
if lt == 'string' then lock = redis.call('GET', KEYS[3]) end
return {fields, ptr, lock, redis.call('TIME'), rt, pt, lt}
`, true)

// isCluster reports whether client talks to a Redis Cluster.
func isCluster(client rueidis.Client) bool { return client.Mode() == rueidis.ClientModeCluster }

// Read reads idx's registry, pointer and lock in one step and checks them
// (see [Parse]); a pointer must name the current generation, in canonical
// decimal. The pointer of an index without a group that a group claimed
// (SPEC C102) returns the snapshot, with InGroup set, and an error
// matching keys.ErrGroupConflict naming the group. An index that never used generations has an empty registry
// and no pointer.
func Read(ctx context.Context, client rueidis.Client, idx Index) (Snapshot, error) {
	cluster := idx.names(client)
	s := Snapshot{
		PointerKey: keys.PointerKey(idx.Live, cluster),
		LockKey:    keys.LockKey(idx.Live, cluster),
	}
	regKey := keys.RegistryKey(idx.Live, cluster)
	res, err := readScript.Exec(ctx, client, []string{regKey, s.PointerKey, s.LockKey}, nil).ToArray()
	if err != nil {
		return Snapshot{}, err
	}
	if len(res) != 7 {
		return Snapshot{}, fmt.Errorf("unexpected reply of %d elements to the registry read", len(res))
	}
	var types [3]string
	for i := range types {
		if types[i], err = res[4+i].ToString(); err != nil {
			return Snapshot{}, fmt.Errorf("unexpected TYPE reply %v: %w", res[4+i], err)
		}
	}
	for i, want := range []struct{ key, typ string }{{regKey, "hash"}, {s.PointerKey, "string"}, {s.LockKey, "string"}} {
		if types[i] != want.typ && types[i] != "none" {
			return Snapshot{}, &CorruptError{Key: want.key, Value: types[i], Problem: "its type (keyswap makes it a " + want.typ + ")"}
		}
	}
	fields, err := res[0].AsStrMap()
	if err != nil {
		return Snapshot{}, fmt.Errorf("HGETALL %s: %w", regKey, err)
	}
	if s.Registry, err = Parse(regKey, fields); err != nil {
		return Snapshot{}, err
	}
	ptr, err := res[1].ToString()
	switch {
	case err != nil:
		return Snapshot{}, fmt.Errorf("GET %s: %w", s.PointerKey, err)
	case types[1] == "string" && idx.Group == "" && strings.HasPrefix(ptr, keys.GroupMarkerPrefix):
		// A group's claim: the index's generations are behind the group's
		// pointer. Not corrupt: read it with the group.
		s.InGroup, _ = keys.ParseGroupMarker(ptr)
	case types[1] == "string":
		g, ok := canonical(ptr, 1)
		if !ok {
			return Snapshot{}, &CorruptError{Key: s.PointerKey, Value: ptr, Problem: "not a generation (a positive number in canonical decimal)"}
		}
		if st, found := s.Registry.Gens[g]; !found || st.Kind != Current {
			return Snapshot{}, &CorruptError{Key: s.PointerKey, Value: ptr, Problem: fmt.Sprintf("a generation that is not current in %s (its state: %q)", regKey, st.Raw)}
		}
		s.Pointer, s.HasPointer = g, true
	}
	if s.Lock, err = res[2].ToString(); err != nil {
		return Snapshot{}, fmt.Errorf("GET %s: %w", s.LockKey, err)
	}
	clock, err := res[3].AsStrSlice()
	if err != nil || len(clock) != 2 {
		return Snapshot{}, fmt.Errorf("unexpected TIME reply %v: %w", res[3], err)
	}
	sec, err1 := strconv.ParseInt(clock[0], 10, 64)
	usec, err2 := strconv.ParseInt(clock[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return Snapshot{}, fmt.Errorf("unexpected TIME reply %q: %w", clock, err)
	}
	s.Time = time.Unix(sec, usec*1000)
	if s.InGroup != "" {
		return s, keys.GroupConflict(idx.Live, s.PointerKey, s.InGroup, "")
	}
	return s, nil
}
