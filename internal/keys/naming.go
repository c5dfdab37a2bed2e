package keys

import (
	"math"
	"strconv"
	"strings"
)

const (
	// LockSuffix ends every lock key. It never matches the sweep pattern
	// "*:rebuild:*" nor the temp-key recogniser, so a sweep can never
	// delete a lock.
	LockSuffix = ":rebuild-lock"
	// TempInfix separates a temp key's base from its timestamp.
	TempInfix = ":rebuild:"
	// NonceLen is the length of a temp key's hex nonce: 64 bits.
	NonceLen = 16
	// ReceiptSuffix follows a lock key to name the receipt a fenced
	// publish leaves: "<lock key>:done", holding the lock's token for a
	// short while, in the lock's slot. Like the lock it never matches the
	// sweep pattern nor the temp-key recogniser.
	ReceiptSuffix = ":done"
	// RecordSuffix follows a lock key to name the record of the run that
	// holds the lock: "<lock key>:run", a hash with the run's token, the
	// batches it wrote, its status and the operator's requests. It lives
	// exactly as long as the lock.
	RecordSuffix = ":run"
	// LogSuffix follows a lock key to name the log of the changes applied
	// to the live keys while the run that holds the lock runs:
	// "<lock key>:log", a list. It lives no longer than the lock.
	LogSuffix = ":log"
	// CtlSuffix follows a lock key to name the operator's requests to the
	// run that holds the lock: "<lock key>:ctl", a hash (cancel, a rate, a
	// pause, a held run's decision) that the run reads at every heartbeat.
	// It is the only key of a run that operators write, and it lives no
	// longer than the lock.
	CtlSuffix = ":ctl"
	// CutOverSuffix follows a lock key to name the cut-over mark of the
	// run that holds the lock: "<lock key>:cut", a string holding the
	// run's token with a PX deadline, set while the run drains its log of
	// changes to flip (Generations mode across slots). Apply waits while
	// it is set; the flip deletes it.
	CutOverSuffix = ":cut"
	// MetaSuffix follows a base to name the metadata of a live key or a
	// family: "<base>:rebuild-gen", a hash with its generation. It has no
	// TTL: it lives as long as the index.
	MetaSuffix = ":rebuild-gen"
	// PrevSuffix follows a base to name the previous value of a live key
	// kept for a rollback: "<base>:rebuild-prev", with a TTL.
	PrevSuffix = ":rebuild-prev"
	// OwnerSuffix follows a base to name its owner stamp:
	// "<base>:rebuild-owner", a string holding the live key (or family
	// prefix) whose base it is, set by the first run in Generations mode
	// to take the base's lock, or to claim the index for a group, without
	// a TTL, on a cluster and where another key can have the base
	// (Aliasable; SPEC C104). On a cluster an untagged key X and the
	// tagged key "{X}" share the base "{X}", and so every key derived from
	// it: the stamp lets a run of one refuse the base once the other owns
	// it.
	OwnerSuffix = ":rebuild-owner"
)

// ReceiptKey returns the key of the receipt a publish fenced on lockKey
// leaves.
func ReceiptKey(lockKey string) string { return lockKey + ReceiptSuffix }

// RecordKey returns the key of the record of the run holding lockKey.
func RecordKey(lockKey string) string { return lockKey + RecordSuffix }

// LogKey returns the key of the log of changes kept for the run holding
// lockKey.
func LogKey(lockKey string) string { return lockKey + LogSuffix }

// CtlKey returns the key of the operator's requests to the run holding
// lockKey.
func CtlKey(lockKey string) string { return lockKey + CtlSuffix }

// CutOverKey returns the key of the cut-over mark of the run holding
// lockKey.
func CutOverKey(lockKey string) string { return lockKey + CutOverSuffix }

// MetaKey returns the key of live's metadata: its generation.
func MetaKey[S Space](live string, s S) string { return Base(live, s) + MetaSuffix }

// PrevKey returns the key that keeps live's previous value for a rollback.
func PrevKey[S Space](live string, s S) string { return Base(live, s) + PrevSuffix }

// Reserved reports whether key has the shape of a key keyswap makes next
// to a live key: a lock, a lock's receipt, record, log, requests or
// cut-over mark, a live key's metadata, kept previous value or base's
// owner stamp, a temp key (current or legacy
// shape), an index's pointer, registry of generations, generation's data
// key or manifest, or anything that starts like the base of an index in a
// group (ParseGroupBase). keyswap refuses to rebuild such a key: it would take it for its
// own.
func Reserved(key string) bool {
	if _, _, ok := ParseTempKey(key); ok || IsGenKey(key) || IsCounterKey(key) || IsManifestKey(key) {
		return true
	}
	if _, _, ok := ParseGroupBase(key); ok {
		return true
	}
	for _, suffix := range []string{LockSuffix, MetaSuffix, PrevSuffix, OwnerSuffix, PointerSuffix, RegistrySuffix,
		LockSuffix + ReceiptSuffix, LockSuffix + RecordSuffix, LockSuffix + LogSuffix, LockSuffix + CtlSuffix, LockSuffix + CutOverSuffix} {
		if strings.HasSuffix(key, suffix) {
			return true
		}
	}
	return false
}

// Base returns the key that the lock and temp keys of live are derived
// from. On a standalone server it is live itself (Familia's shapes). On a
// cluster it is a key in live's slot whose derived keys stay in that slot;
// see the package documentation for the three cases. In a group (a Names
// with a Group) it is GroupBase(group, live), on a standalone server too.
func Base[S Space](live string, s S) string {
	n := namesOf(s)
	if n.Group != "" {
		return GroupBase(n.Group, live)
	}
	if !n.Cluster {
		return live
	}
	if _, ok := HashTag(live); ok {
		// Appending a suffix cannot change which '{' comes first, nor the
		// '}' that closes it, so every derived key keeps live's tag.
		return live
	}
	if live != "" && !strings.Contains(live, "}") {
		// "{" + live + "}" is tagged with all of live: the first '{' is
		// ours and, live having no '}', the first '}' after it is ours too.
		return "{" + live + "}"
	}
	// Keys such as "a{}b" or "a}b" hash as a whole, and wrapping them would
	// tag only the part before their own '}' ("{}" would not tag at all).
	// Borrow a tag in their slot.
	return "{" + SyntheticTag(Slot(live)) + "}" + live
}

// SyntheticTag returns "rbN" for the smallest N ≥ 0 with Slot("rbN") ==
// slot. Every slot is reached before N = 200000: the first call computes
// the tag of every slot at once (a few milliseconds), later calls look it
// up, so that Base of a key such as "a}b", which borrows one, costs no
// search on every call.
func SyntheticTag(slot uint16) string {
	return slotTags()[slot%SlotCount]
}

// LockKey returns the rebuild lock key of live: Base(live) + ":rebuild-lock".
func LockKey[S Space](live string, s S) string {
	return LockKeyForBase(Base(live, s))
}

// LockKeyForBase returns the lock key that guards the temp keys derived from
// base, as returned by [ParseTempKey].
func LockKeyForBase(base string) string {
	return base + LockSuffix
}

// VetoLocks returns the lock keys whose existence protects a temp key
// derived from base, as the sweep applies them: base's own lock, then the
// lock of every prefix of base that ends before a ':'. The second part lets
// a SetIndex family, which locks only its prefix, protect the temp keys of
// all its buckets, whose bases are the bucket keys below the prefix. A lock
// on an unrelated shorter key may delay a sweep; it never makes it delete.
func VetoLocks(base string) []string {
	locks := []string{LockKeyForBase(base)}
	for i := strings.LastIndexByte(base, ':'); i > 0; i = strings.LastIndexByte(base[:i], ':') {
		locks = append(locks, LockKeyForBase(base[:i]))
	}
	return locks
}

// TempKey returns Base(live) + TempSuffix(unix, n).
func TempKey[S Space](live string, s S, unix int64, n uint64) string {
	return Base(live, s) + TempSuffix(unix, n)
}

// TempSuffix returns ":rebuild:<unix>:<nonce>", where nonce is the 16-digit
// lowercase hex form of the 64 random bits n. Every temp key of one run
// ends with the same suffix.
func TempSuffix(unix int64, n uint64) string {
	b := make([]byte, 0, len(TempInfix)+20+1+NonceLen)
	b = append(b, TempInfix...)
	b = strconv.AppendInt(b, unix, 10)
	b = append(b, ':')
	const hex = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, hex[n>>uint(shift)&0xf])
	}
	return string(b)
}

// ParseCurrentTempKey is [ParseTempKey] for the current shape only, with
// its nonce: the shape keyswap itself makes.
func ParseCurrentTempKey(key string) (base string, unix int64, ok bool) {
	n := len(key)
	if n <= NonceLen || key[n-NonceLen-1] != ':' || !isHex(key[n-NonceLen:]) {
		return "", 0, false
	}
	return parseStamp(key[:n-NonceLen-1])
}

// ParseTempKey recognises a temp key and returns its base and timestamp.
//
// The recogniser is anchored at the end of the key: ":rebuild:",
// decimal digits, then optionally ":" and 16 hex digits of either case. The
// legacy shape without a nonce is accepted. The base is everything
// before that suffix, so the base of "a:rebuild:1:rebuild:2" is
// "a:rebuild:1". Lock keys are never recognised.
func ParseTempKey(key string) (base string, unix int64, ok bool) {
	rest := key
	// Optional ":<16 hex>" nonce.
	if n := len(rest); n > NonceLen && rest[n-NonceLen-1] == ':' && isHex(rest[n-NonceLen:]) {
		if b, u, ok := parseStamp(rest[:n-NonceLen-1]); ok {
			return b, u, true
		}
	}
	return parseStamp(rest)
}

// parseStamp matches "<base>:rebuild:<digits>" anchored at the end.
func parseStamp(s string) (base string, unix int64, ok bool) {
	i := len(s)
	for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		i--
	}
	if i == len(s) || !strings.HasSuffix(s[:i], TempInfix) {
		return "", 0, false
	}
	u, err := strconv.ParseInt(s[i:], 10, 64)
	if err != nil {
		// More digits than an int64 holds: not a timestamp we wrote. Ruby's
		// Integer would read it as a huge number, never older than the
		// sweep's cutoff; saturate so the Go sweep leaves it alone too.
		u = math.MaxInt64
	}
	return s[:i-len(TempInfix)], u, true
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}
