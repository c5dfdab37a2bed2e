// Package sources makes the sources a Rebuilder pulls its items from: a
// slice, an iterator, the rows of an SQL query, or the keys of Redis itself
// read with SCAN. A [Source] is a function, so any other source is a few
// lines of your own.
package sources

import (
	"context"
	"fmt"
	"iter"
	"slices"

	"github.com/keyswap/keyswap/internal/hook"
	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/scan"
	"github.com/redis/rueidis"
)

// Source is where a run's items come from. A Rebuilder's Run (or Build)
// calls it once, with a context that is cancelled when the run ends or
// fails, and pulls the sequence it returns: items, or an error. A source
// yields an error at most once and then returns; Run stops at the first
// one.
//
// The source must reflect the data as of the moment Run pulls it: build the
// sequence lazily (a query run when the sequence is first pulled), not from
// a snapshot taken before Run was called.
type Source[T any] func(ctx context.Context) iter.Seq2[T, error]

// Slice returns a source that yields the items of s.
func Slice[T any](s []T) Source[T] {
	return Seq(slices.Values(s))
}

// Seq returns a source that yields the items of seq, which cannot fail.
func Seq[T any](seq iter.Seq[T]) Source[T] {
	return func(context.Context) iter.Seq2[T, error] {
		return func(yield func(T, error) bool) {
			for it := range seq {
				if !yield(it, nil) {
					return
				}
			}
		}
	}
}

// Seq2 returns a source that yields the items and the error of seq,
// such as an iterator over a database cursor. seq must yield an error at
// most once and then return. Prefer a Source of your own when the iterator
// needs a context: Run passes one.
func Seq2[T any](seq iter.Seq2[T, error]) Source[T] {
	return func(context.Context) iter.Seq2[T, error] { return seq }
}

// ScanOptions selects the keys of a SCAN source.
type ScanOptions struct {
	// Match is the SCAN MATCH pattern, such as "user:*:object". Empty
	// matches every key.
	Match string
	// Type is the SCAN TYPE filter, such as "hash". Empty means any type.
	Type string
	// Count is the SCAN COUNT hint, and the number of keys read per round
	// trip. Zero means 1000.
	Count int64
}

// Scan returns a source that streams the keys matching opts with SCAN
// (on every master of a cluster), reads each with the command read returns,
// and yields what decode makes of the reply. decode returns ok false to
// skip a key, such as one deleted since SCAN returned it. This is Familia's
// fallback strategy of rebuilding an index from the object keys themselves.
//
// The source never yields keyswap's own keys (temp keys, locks, records,
// generations), nor the keys of the run that pulls it: the index being
// rebuilt, or the buckets of its families, even when match covers them.
//
// Memory is bounded by one SCAN page: keys are read Count at a time, each
// group in one pipelined round trip, and yielded before more are read. SCAN
// returns every key that exists for the whole scan at least once; it may
// return a key twice, which index writes absorb (the last write wins).
// The source stops at the first error, read or decode, and yields it.
// decode sees a missing key as Redis replies for it: a nil message for GET
// or HGET, an empty map for HGETALL, an array of nils for HMGET.
func Scan[T any](client rueidis.Client, opts ScanOptions,
	read func(cb rueidis.Builder, key string) rueidis.Completed,
	decode func(key string, reply rueidis.RedisMessage) (item T, ok bool, err error)) Source[T] {
	count := opts.Count
	if count <= 0 {
		count = 1000
	}
	return func(ctx context.Context) iter.Seq2[T, error] {
		return scanSeq(ctx, client, opts.Match, opts.Type, count, read, decode)
	}
}

// scanSeq is the sequence of a Scan source pulled with ctx.
func scanSeq[T any](ctx context.Context, client rueidis.Client, match, typ string, count int64,
	read func(cb rueidis.Builder, key string) rueidis.Completed,
	decode func(key string, reply rueidis.RedisMessage) (item T, ok bool, err error)) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		var zero T
		for page, err := range scan.Pages(ctx, client, scan.Options{Match: match, Type: typ, Count: count}) {
			if err != nil {
				yield(zero, fmt.Errorf("SCAN %q: %w", match, err))
				return
			}
			// keyswap's own keys (temp keys, locks, records) and the keys
			// of the run that pulls the source are never items.
			page = slices.DeleteFunc(page, func(k string) bool { return keys.Reserved(k) || hook.OwnKey(ctx, k) })
			// SCAN's COUNT is a hint: a page can hold many more keys (small
			// keyspaces, some servers ignore it). Read Count at a time.
			for chunk := range slices.Chunk(page, int(count)) {
				if !readChunk(ctx, client, chunk, read, decode, yield) {
					return
				}
			}
		}
	}
}

// readChunk reads keys in one DoMulti and yields what decode makes of them.
// It reports whether the source should go on.
func readChunk[T any](ctx context.Context, client rueidis.Client, page []string,
	read func(cb rueidis.Builder, key string) rueidis.Completed,
	decode func(key string, reply rueidis.RedisMessage) (item T, ok bool, err error),
	yield func(T, error) bool) bool {
	var zero T
	cmds := make(rueidis.Commands, len(page))
	for i, k := range page {
		cmds[i] = read(client.B(), k)
	}
	for i, r := range client.DoMulti(ctx, cmds...) {
		msg, err := r.ToMessage()
		if err != nil && !rueidis.IsRedisNil(err) {
			yield(zero, fmt.Errorf("read %q: %w", page[i], err))
			return false
		}
		item, ok, err := decode(page[i], msg)
		if err != nil {
			yield(zero, fmt.Errorf("decode %q: %w", page[i], err))
			return false
		}
		if ok && !yield(item, nil) {
			return false
		}
	}
	return true
}

// Hashes is [Scan] for hashes read with HGETALL: it yields what
// decode makes of each hash matching match, and skips keys that vanished
// (or were emptied) between SCAN and HGETALL.
func Hashes[T any](client rueidis.Client, match string,
	decode func(key string, fields map[string]string) (item T, ok bool, err error)) Source[T] {
	return Scan(client, ScanOptions{Match: match, Type: "hash"},
		func(cb rueidis.Builder, key string) rueidis.Completed { return cb.Hgetall().Key(key).Build() },
		func(key string, reply rueidis.RedisMessage) (T, bool, error) {
			var zero T
			fields, err := reply.AsStrMap()
			if err != nil {
				return zero, false, err
			}
			if len(fields) == 0 {
				return zero, false, nil
			}
			return decode(key, fields)
		})
}
