package reader

import (
	"context"
	"strconv"

	"github.com/redis/rueidis"
)

// read sends the command cmd builds for ref's current data key and parses
// its reply with parse, which reports whether the answer proves the key
// present. When it does not, read rechecks the pointer without the cache
// and, if the generation changed, reads the new key: the cached generation
// may have been removed after a flip the cache missed.
func read[T any](ctx context.Context, r *Reader, ref Ref, op string,
	cmd func(b rueidis.Builder, key string) rueidis.Completed,
	parse func(rueidis.RedisResult) (v T, present bool, err error)) (T, bool, error) {
	key, err := r.Resolve(ctx, ref)
	if err != nil {
		var zero T
		return zero, false, err
	}
	v, present, err := parse(r.client.Do(ctx, cmd(r.client.B(), key)))
	if err != nil || present {
		return v, present, wrap(op, key, err)
	}
	now, changed, err := r.Recheck(ctx, ref, key)
	if err != nil || !changed {
		return v, false, err
	}
	v, present, err = parse(r.client.Do(ctx, cmd(r.client.B(), now)))
	return v, present, wrap(op, now, err)
}

// wrap returns err as an *Error of op on key, or nil.
func wrap(op, key string, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Op: op, Key: key, Err: err}
}

// HGet returns the value of field in ref's hash, and ok false when the
// hash or the field is missing (after a recheck of the pointer, at one
// more round trip).
func (r *Reader) HGet(ctx context.Context, ref Ref, field string) (value string, ok bool, err error) {
	return read(ctx, r, ref, "hget",
		func(b rueidis.Builder, key string) rueidis.Completed { return b.Hget().Key(key).Field(field).Build() },
		func(res rueidis.RedisResult) (string, bool, error) {
			v, err := res.ToString()
			if rueidis.IsRedisNil(err) {
				return "", false, nil
			}
			return v, err == nil, err
		})
}

// SIsMember reports whether member is in ref's set. A false answer is
// rechecked against the pointer (one more round trip) before it is
// returned.
func (r *Reader) SIsMember(ctx context.Context, ref Ref, member string) (bool, error) {
	ok, _, err := read(ctx, r, ref, "sismember",
		func(b rueidis.Builder, key string) rueidis.Completed {
			return b.Sismember().Key(key).Member(member).Build()
		},
		func(res rueidis.RedisResult) (bool, bool, error) {
			ok, err := res.AsBool()
			return ok, ok, err
		})
	return ok, err
}

// SMembers returns the members of ref's set, in no particular order. An
// empty answer is rechecked against the pointer (one more round trip)
// before it is returned.
func (r *Reader) SMembers(ctx context.Context, ref Ref) ([]string, error) {
	members, _, err := read(ctx, r, ref, "smembers",
		func(b rueidis.Builder, key string) rueidis.Completed { return b.Smembers().Key(key).Build() },
		func(res rueidis.RedisResult) ([]string, bool, error) {
			m, err := res.AsStrSlice()
			return m, len(m) > 0, err
		})
	return members, err
}

// ZScore returns the score of member in ref's sorted set, and ok false when
// the sorted set or the member is missing (after a recheck of the pointer,
// at one more round trip).
func (r *Reader) ZScore(ctx context.Context, ref Ref, member string) (score float64, ok bool, err error) {
	return read(ctx, r, ref, "zscore",
		func(b rueidis.Builder, key string) rueidis.Completed {
			return b.Zscore().Key(key).Member(member).Build()
		},
		func(res rueidis.RedisResult) (float64, bool, error) {
			s, err := res.AsFloat64()
			if rueidis.IsRedisNil(err) {
				return 0, false, nil
			}
			return s, err == nil, err
		})
}

// ZRange returns the members of ref's sorted set from rank start to rank
// stop (inclusive; negative ranks count from the end, -1 is the last),
// lowest score first, with their scores. An empty answer is rechecked
// against the pointer (one more round trip) before it is returned.
func (r *Reader) ZRange(ctx context.Context, ref Ref, start, stop int64) ([]rueidis.ZScore, error) {
	return r.zrange(ctx, ref, "zrange", start, stop, false)
}

// ZRevRange is [Reader.ZRange] with the highest score first: rank 0 is
// the highest, as in a leaderboard.
func (r *Reader) ZRevRange(ctx context.Context, ref Ref, start, stop int64) ([]rueidis.ZScore, error) {
	return r.zrange(ctx, ref, "zrevrange", start, stop, true)
}

func (r *Reader) zrange(ctx context.Context, ref Ref, op string, start, stop int64, rev bool) ([]rueidis.ZScore, error) {
	out, _, err := read(ctx, r, ref, op,
		func(b rueidis.Builder, key string) rueidis.Completed {
			byRank := b.Zrange().Key(key).Min(strconv.FormatInt(start, 10)).Max(strconv.FormatInt(stop, 10))
			if rev {
				return byRank.Rev().Withscores().Build()
			}
			return byRank.Withscores().Build()
		},
		func(res rueidis.RedisResult) ([]rueidis.ZScore, bool, error) {
			zs, err := res.AsZScores()
			return zs, len(zs) > 0, err
		})
	return out, err
}
