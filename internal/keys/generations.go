package keys

import (
	"strconv"
	"strings"
	"sync"
)

// The shapes of generational publishing. In that mode an index's data lives
// under a generation, a number, and a pointer per index names the current
// one:
//
//	pointer:  <base>:rebuild-ptr             a string: the current generation
//	registry: <base>:rebuild-gens            a hash: the index's generations
//	plain key of generation G:   <key>:rebuild-g:<G>
//	bucket B of family P in G:   <P>:rebuild-g:<G>:<B>
//	a run's writes in slot S:    {rbN}<base>:rebuild-n:<G>   (a cluster only)
//	manifest of G:               <base>:rebuild-m:<G>        a set: keys Apply wrote
//	                             <base>:rebuild-l:<G>       a list: keys the run wrote
//
// The pointer and the registry hang off the base, so on a cluster they share
// the lock's slot; the data keys hang off the key itself, so they keep a
// user's own hash tag and, without one, spread over every slot. An index
// with no pointer is in the rename-in-place shape: its data is <key>, or
// <P>:<B>.
const (
	// PointerSuffix follows a base to name an index's pointer: a string
	// holding its current generation, in decimal.
	PointerSuffix = ":rebuild-ptr"
	// RegistrySuffix follows a base to name an index's registry of
	// generations: a hash (see the Reg* fields).
	RegistrySuffix = ":rebuild-gens"
	// GenInfix follows a plain key or a family's prefix in a generation's
	// data keys.
	GenInfix = ":rebuild-g:"
	// CounterInfix follows a run's lock base in the key of the counter of
	// its writes in one hash slot, and precedes its first generation.
	CounterInfix = ":rebuild-n:"
	// ManifestInfix follows a base in the key of a generation's manifest
	// (a set), and precedes the generation; ManifestListInfix in the key of
	// the list of its manifest.
	ManifestInfix     = ":rebuild-m:"
	ManifestListInfix = ":rebuild-l:"
	// ManifestListed is the member a run adds to the manifest of the
	// generation it built once its flip to it returned: the
	// manifest of a generation holding it lists every key keyswap wrote in
	// it. It is no key of any generation (those start with their index's
	// prefix and GenInfix).
	ManifestListed = "rebuild-listed"
)

// The registry's fields. RegNext holds the last generation allocated; each
// generation G allocated and not yet removed has a field "G" whose value
// is its state: RegBuilding followed by the token of the run that builds
// it, RegCurrent, RegPrevious (kept for a rollback), or RegRetired
// followed by the time of its retirement in milliseconds since the epoch.
const (
	RegNext     = "next"
	RegBuilding = "building:"
	RegCurrent  = "current"
	RegPrevious = "previous"
	RegRetired  = "retired:"
)

// PointerKey returns the key of the pointer of the index whose live key (or
// family prefix) is live.
func PointerKey[S Space](live string, s S) string { return Base(live, s) + PointerSuffix }

// RegistryKey returns the key of the registry of generations of the index
// whose live key (or family prefix) is live.
func RegistryKey[S Space](live string, s S) string { return Base(live, s) + RegistrySuffix }

// GenKey returns the key that holds plain key live in generation gen.
func GenKey(live string, gen int64) string {
	return live + GenInfix + strconv.FormatInt(gen, 10)
}

// GenPrefix returns the prefix of the keys of family prefix's buckets in
// generation gen: bucket b is GenPrefix(prefix, gen) + b.
func GenPrefix(prefix string, gen int64) string {
	return prefix + GenInfix + strconv.FormatInt(gen, 10) + ":"
}

// GenBucketKey returns the key that holds bucket of family prefix in
// generation gen.
func GenBucketKey(prefix string, gen int64, bucket string) string {
	return GenPrefix(prefix, gen) + bucket
}

// GenPattern returns a SCAN MATCH pattern for the bucket keys of family
// prefix in generation gen, with the glob characters of prefix escaped.
func GenPattern(prefix string, gen int64) string {
	return GlobEscape(GenPrefix(prefix, gen)) + "*"
}

// GlobEscape escapes the characters that SCAN MATCH and KEYS treat as
// special, so that s matches only itself.
func GlobEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// IsGenKey reports whether key has the shape of a generation's data key:
// it holds GenInfix followed by a generation (digits) and then either its
// end or a colon.
func IsGenKey(key string) bool {
	for rest := key; ; {
		i := strings.Index(rest, GenInfix)
		if i < 0 {
			return false
		}
		rest = rest[i+len(GenInfix):]
		n := 0
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if n > 0 && (n == len(rest) || rest[n] == ':') {
			return true
		}
	}
}

// ManifestKey returns the key of the manifest of generation gen of the
// index whose live key (or family prefix) is live: a set, in the
// registry's slot, of keys of the generation that Apply and the flip's
// tail wrote (in the step of the writes), and ManifestListed, which a family's run adds after its
// flip to the generation. The run lists the keys it writes in ManifestListKey. Only a
// family whose keys share the registry's slot (a standalone server, or a
// prefix with a hash tag) has one.
func ManifestKey[S Space](live string, s S, gen int64) string {
	return Base(live, s) + ManifestInfix + strconv.FormatInt(gen, 10)
}

// ManifestListKey returns the key of the list of the manifest of
// generation gen of live (see ManifestKey): a family's run appends each key
// it writes, in the transaction of its first write of the key. A list
// reads far cheaper than a set (LRANGE against SSCAN), and the run writes
// each key once; Apply, which may write a key many times, adds to the set.
func ManifestListKey[S Space](live string, s S, gen int64) string {
	return Base(live, s) + ManifestListInfix + strconv.FormatInt(gen, 10)
}

// IsManifestKey reports whether key has the shape of a generation's
// manifest or its list: ManifestInfix or ManifestListInfix followed by a
// generation (digits) at its end.
func IsManifestKey(key string) bool {
	return endsInGen(key, ManifestInfix) || endsInGen(key, ManifestListInfix)
}

// endsInGen reports whether key ends with infix followed by digits.
func endsInGen(key, infix string) bool {
	i := strings.LastIndex(key, infix)
	if i < 0 {
		return false
	}
	rest := key[i+len(infix):]
	if rest == "" {
		return false
	}
	for j := 0; j < len(rest); j++ {
		if rest[j] < '0' || rest[j] > '9' {
			return false
		}
	}
	return true
}

// slotTags holds SyntheticTag(slot) for every slot, computed at once: a run
// whose writes spread over a cluster needs many of them, and Base one on
// every call for some keys.
var slotTags = sync.OnceValue(func() []string {
	tags := make([]string, SlotCount)
	left := len(tags)
	buf := []byte("rb")
	for n := uint64(0); left > 0; n++ {
		buf = strconv.AppendUint(buf[:2], n, 10)
		if s := Slot(string(buf)); tags[s] == "" {
			tags[s] = string(buf)
			left--
		}
	}
	return tags
})

// CounterKey returns the key of the counter of a Generations run's writes
// in hash slot slot of a cluster: "{" + SyntheticTag(slot) + "}" +
// Base(live, true) + CounterInfix + gen, where live is the run's first
// index and gen the generation it builds of it. The key is in slot, and
// names the run's lock base and generation, so that runs never share one.
func CounterKey(live string, slot uint16, gen int64) string {
	return "{" + SyntheticTag(slot) + "}" + Base(live, true) + CounterInfix + strconv.FormatInt(gen, 10)
}

// IsCounterKey reports whether key has the shape of a run's per-slot
// counter: CounterInfix followed by a generation (digits) at its end.
func IsCounterKey(key string) bool {
	return endsInGen(key, CounterInfix)
}
