package reliability

// Generation records. Every publish advances, in the same atomic step as
// the renames, the record "<base>:rebuild-gen" of each builder's key (a
// family's prefix): a hash holding seq and gen, the number of publishes of
// that key, and at, the publish's time in milliseconds since the epoch (the
// publishing process's clock). The record has no TTL: it lives as long as
// the index, so a finished rebuild leaves it beside the live keys, and the
// suites check its exact contents instead of counting it as a leak.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/redis/rueidis"
)

// metaKey is keys.MetaKey, for files whose own names shadow package keys.
func metaKey(live string, cluster bool) string { return keys.MetaKey(live, cluster) }

// genWindow is when a publish may have run: from just before the Run that
// made it to just after it returned.
type genWindow struct{ from, to time.Time }

// genRecord is a generation record's contents, or nil when it is absent.
func genRecord(ctx context.Context, c rueidis.Client, meta string) (map[string]string, error) {
	m, err := c.Do(ctx, c.B().Hgetall().Key(meta).Build()).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("HGETALL %s: %w", meta, err)
	}
	if len(m) == 0 {
		return nil, nil
	}
	pttl, err := c.Do(ctx, c.B().Pttl().Key(meta).Build()).AsInt64()
	if err != nil {
		return nil, fmt.Errorf("PTTL %s: %w", meta, err)
	}
	if pttl != -1 {
		return nil, fmt.Errorf("%s has PTTL %d ms, want none: a generation record lives as long as its index", meta, pttl)
	}
	return m, nil
}

// checkGeneration returns nil if the generation record of live is exactly
// what the gen-th publish of live, made within w, leaves: the fields seq
// and gen, both gen, at within w, for a family of keys also family, the
// type of its keys, nothing else, and no TTL. cluster says how live's base
// is derived (keys.Base).
func checkGeneration(ctx context.Context, c rueidis.Client, live string, cluster bool, gen int64, w genWindow) error {
	meta := keys.MetaKey(live, cluster)
	m, err := genRecord(ctx, c, meta)
	if err != nil {
		return err
	}
	want := strconv.FormatInt(gen, 10)
	fields := []string{"at", "gen", "seq"}
	if f, ok := m["family"]; ok {
		if f != "set" && f != "zset" && f != "hash" {
			return fmt.Errorf("%s: family %q, want the type of the family's keys: set, zset or hash", meta, f)
		}
		fields = []string{"at", "family", "gen", "seq"}
	}
	if !slices.Equal(slices.Sorted(maps.Keys(m)), fields) || m["seq"] != want || m["gen"] != want {
		return fmt.Errorf("%s = %v, want seq and gen %s and at (and family for a family), nothing else", meta, m, want)
	}
	at, err := strconv.ParseInt(m["at"], 10, 64)
	if err != nil || at < w.from.UnixMilli() || at > w.to.UnixMilli() {
		return fmt.Errorf("%s: at %q, want a time in ms within [%d, %d], the run that published generation %d",
			meta, m["at"], w.from.UnixMilli(), w.to.UnixMilli(), gen)
	}
	return nil
}

// sameGeneration returns nil if the generation record of live holds
// exactly was, the contents genRecord read earlier (nil: absent).
func sameGeneration(ctx context.Context, c rueidis.Client, live string, cluster bool, was map[string]string) error {
	meta := keys.MetaKey(live, cluster)
	m, err := genRecord(ctx, c, meta)
	if err != nil {
		return err
	}
	if !maps.Equal(m, was) {
		return fmt.Errorf("%s = %v, want it unchanged, %v: no publish happened", meta, m, was)
	}
	return nil
}
