package guards

// DiffOptions bounds a held run's Diff (rebuild.Held.Diff).
type DiffOptions struct {
	// Limit is the most entries read from each key of a comparison. The
	// counts are exact when one of the two keys has at most Limit entries
	// (it is read whole); when both have more, they are estimated from
	// random samples. Zero means 100,000.
	Limit int
	// Samples is the number of differing entries shown per key. Zero means
	// 10.
	Samples int
	// MaxKeys is the most keys of a family compared one by one; the rest
	// are only counted. Zero means 100.
	MaxKeys int
}

// Diff is a held run's result next to the live keys.
type Diff struct {
	Builders []BuilderDiff
}

// BuilderDiff is one builder's part of a [Diff].
type BuilderDiff struct {
	// Key is the builder's key; Family reports a family.
	Key    string
	Family bool
	// Keys are the keys compared: the builder's key, or up to
	// DiffOptions.MaxKeys buckets of a family, those that differ first.
	Keys []KeyDiff
	// Compared is the number of a family's buckets compared, out of
	// Buckets (new or live).
	Compared, Buckets int
	// BucketsAdded and BucketsRemoved count the buckets only the new
	// family has, and those only the live one has.
	BucketsAdded, BucketsRemoved int
	// Added, Removed and Changed sum Keys' counts.
	Added, Removed, Changed int64
	// Exact is false when a count is an estimate: a new key and a live key
	// both past DiffOptions.Limit, or a family with buckets not compared.
	Exact bool
}

// KeyDiff compares one new key with its live key.
type KeyDiff struct {
	// Live is the live key, Temp the new one.
	Live, Temp string
	// Type and LiveType are their types ("none" when absent).
	Type, LiveType string
	// NewSize and LiveSize are their entries.
	NewSize, LiveSize int64
	// Added, Removed and Changed count entries only in the new key, only
	// in the live one, and in both with another value or score.
	Added, Removed, Changed int64
	// Exact is false for estimates, and for types not compared entry by
	// entry (strings, lists, streams).
	Exact bool
	// Samples are some of the differing entries.
	Samples []DiffEntry
}

// DiffEntry is one entry that differs.
type DiffEntry struct {
	// Kind is "added", "removed" or "changed".
	Kind string
	// Entry is the field or member; Old and New its values or scores.
	Entry, Old, New string
}
