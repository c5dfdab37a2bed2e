package protocol_test

import (
	"errors"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyswap/keyswap/internal/keys"
	"github.com/keyswap/keyswap/internal/protocol"
	"github.com/keyswap/keyswap/internal/redistest"
)

func TestEncodeKeys(t *testing.T) {
	// The record keeps a run's keys length-prefixed (C79): any byte
	// survives, a newline and bytes that are not UTF-8 included.
	for _, ks := range [][]string{
		nil,
		{"a"},
		{"a\nb", "c"},
		{"{tag}:x\xff", "", "3:x:", "é"},
	} {
		got, err := protocol.DecodeKeys(protocol.EncodeKeys(ks))
		if err != nil || !slices.Equal(got, ks) {
			t.Errorf("DecodeKeys(EncodeKeys(%q)) = %q, %v", ks, got, err)
		}
	}
	for _, bad := range []string{"a", "1:", "2:a", "01:a", "-1:", ":a", "1:a3:bc"} {
		if got, err := protocol.DecodeKeys(bad); err == nil {
			t.Errorf("DecodeKeys(%q) = %q, want an error", bad, got)
		}
	}
}

func TestParseRecord(t *testing.T) {
	// A record of this version parses whole; one without a version is an
	// older keyswap's (keys joined by newlines); one of another version is
	// refused, with its version alone; a field that is not as keyswap
	// writes it gives an error naming it, the other fields still parsed.
	rec, err := protocol.ParseRecord(map[string]string{
		"v": "2", "token": "t", "mode": "rebuild", "keys": protocol.EncodeKeys([]string{"a\nb", "c"}), "families": "10",
		"suffix": ":rebuild:1:00", "pid": "42", "started": "1700000000123", "ttl": "300", "batches": "4", "logged": "3",
		"work": "12", "phase": "held", "rate": "2.5", "rate_now": "0.5", "latency_us": "1500", "eta": "7",
	})
	wantETA := 7 * time.Second
	if err != nil || rec.Version != "2" || rec.Token != "t" || rec.Mode != protocol.ModeRebuild || !slices.Equal(rec.Keys, []string{"a\nb", "c"}) ||
		!slices.Equal(rec.Families, []bool{true, false}) || rec.PID != 42 || !rec.Started.Equal(time.UnixMilli(1700000000123)) ||
		rec.TTL != 300*time.Second || rec.Batches != 4 || rec.Logged != 3 || rec.Work != 12 || rec.Phase != "held" ||
		rec.Rate != 2.5 || rec.RateNow == nil || *rec.RateNow != 0.5 || rec.Latency != 1500*time.Microsecond || rec.ETA == nil || *rec.ETA != wantETA {
		t.Errorf("ParseRecord: got %+v, %v", rec, err)
	}
	rec, err = protocol.ParseRecord(map[string]string{"token": "t", "keys": "a\nb", "families": "01"})
	if err != nil || rec.Version != "" || !slices.Equal(rec.Keys, []string{"a", "b"}) || !slices.Equal(rec.Families, []bool{false, true}) ||
		rec.RateNow != nil {
		t.Errorf("a v1 record: got %+v, %v", rec, err)
	}
	rec, err = protocol.ParseRecord(map[string]string{"v": "3", "token": "t", "keys": "whatever"})
	if !errors.Is(err, protocol.ErrRecordVersion) || rec.Version != "3" || rec.Token != "" || rec.Keys != nil {
		t.Errorf("a v3 record: got %+v, %v; want ErrRecordVersion and the version alone", rec, err)
	}
	for field, value := range map[string]string{"pid": "x", "started": "-1", "rate": "fast", "rate_now": "x", "keys": "9:a", "families": "2", "eta": "soon"} {
		h := map[string]string{"v": "2", "token": "t", field: value}
		rec, err := protocol.ParseRecord(h)
		if err == nil || !strings.Contains(err.Error(), `"`+field+`"`) || rec.Token != "t" {
			t.Errorf("%s %q: got %+v, %v; want an error naming the field, the token still read", field, value, rec, err)
		}
	}
	if _, err := protocol.ParseRecord(map[string]string{"v": "2", "keys": protocol.EncodeKeys([]string{"a", "b"}), "families": "1"}); err == nil {
		t.Errorf("1 family flag for 2 keys: got no error")
	}
}

func TestParseRequests(t *testing.T) {
	// Requests count only for the run whose token they carry.
	ctl := map[string]string{"token": "t", "cancel": "1", "max_rate": "2.5", "paused": "", "action": "publish"}
	if got, want := protocol.ParseRequests(ctl, "t"), (protocol.Requests{Cancel: true, MaxRate: 2.5, Action: "publish"}); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	for _, token := range []string{"other", ""} {
		if got := protocol.ParseRequests(ctl, token); got != (protocol.Requests{}) {
			t.Errorf("token %q: got %+v, want none", token, got)
		}
	}
	if got := protocol.ParseRequests(map[string]string{"token": "t", "max_rate": "-3"}, "t"); got.MaxRate != 0 {
		t.Errorf("max_rate -3: got %v, want none", got.MaxRate)
	}
}

// luaFields matches the field names the scripts read and write in a
// record, the requests or a meta: the quoted names after a key of theirs
// in HGET, HMGET, HSET, HDEL and HINCRBY.
var luaFields = regexp.MustCompile(`'(HGET|HMGET|HSET|HDEL|HINCRBY)', ([^)]*)\)`)

func TestLuaFieldsAreGoFields(t *testing.T) {
	// The scripts name the record's fields as literal strings: each of
	// them must be one of the names of record.go (or of a registry of
	// generations), so that a field renamed on one side only fails here
	// rather than in production.
	known := slices.Concat(protocol.RecordFields, protocol.CtlFields, protocol.MetaFields, protocol.RegistryNames)
	quoted := regexp.MustCompile(`'([a-z_]+)'`)
	seen := 0
	err := fs.WalkDir(protocol.Scripts, "scripts", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		src, err := protocol.Scripts.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range luaFields.FindAllStringSubmatch(string(src), -1) {
			for _, f := range quoted.FindAllStringSubmatch(m[2], -1) {
				seen++
				if !slices.Contains(known, f[1]) {
					t.Errorf("%s: %s names the field %q, which record.go does not", path, m[0], f[1])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 20 {
		t.Errorf("found %d field names in the scripts: the pattern no longer matches them", seen)
	}
}

func TestKeyShapesAgree(t *testing.T) {
	// lib/keys.lua and package keys (keys.Reserved, protocol.Owns) agree on a
	// table of shapes: what the publish script takes for a key of the run
	// is what the catch-up does (C72).
	lib, err := protocol.Scripts.ReadFile("scripts/lib/keys.lua")
	if err != nil {
		t.Fatal(err)
	}
	src := string(lib) + `
local out = {}
for i = 3, #ARGV do
  out[#out + 1] = keyshapes.reserved(ARGV[i]) and 1 or 0
  out[#out + 1] = keyshapes.owns(ARGV[i], ARGV[1], ARGV[2] == '1') and 1 or 0
end
return out
`
	c := env.Standalone.Client(t)
	ctx := redistest.Ctx(t)
	shapes := []string{
		"p", "p:", "p:a", "p:a:b", "p:\n", "p:\xff", "q:a", "pp:a", "p:a:rebuild-lock", "p:rebuild-lock",
		"p:a:rebuild-lock:run", "p:a:rebuild-lock:log", "p:a:rebuild-lock:ctl", "p:a:rebuild-lock:done", "p:a:rebuild-lock:cut",
		"p:a:rebuild-gen", "p:a:rebuild-prev", "p:a:rebuild:1700000000:0123456789abcdef",
		"p:a:rebuild:1700000000:0123456789ABCDEF", "p:a:rebuild:1700000000", "p:a:rebuild:", "p:a:rebuild:12x",
		"p:a:rebuild:123:abc", "p:a:rebuild:1:rebuild:2", "p:rebuild:99999999999999999999999",
		"p:a:rebuild:1:0123456789abcde", "p:a:rebuild:1:0123456789abcdefg", ":rebuild:1", "rebuild:1",
		"p:a:rebuild-lockx", "p:ctl", "p:a:rebuild-prev:swap", "p::", "p:a:rebuild-lock:ctl:x",
	}
	for _, owner := range []struct {
		key    string
		family bool
	}{{"p", true}, {"p", false}, {"p:a", false}, {"p:a", true}} {
		flag := "0"
		if owner.family {
			flag = "1"
		}
		got, err := c.Do(ctx, c.B().Eval().Script(src).Numkeys(0).Arg(append([]string{owner.key, flag}, shapes...)...).Build()).AsIntSlice()
		if err != nil {
			t.Fatal(err)
		}
		for i, k := range shapes {
			reserved, owns := keys.Reserved(k), protocol.Owns(k, owner.key, owner.family)
			if (got[2*i] == 1) != reserved || (got[2*i+1] == 1) != owns {
				t.Errorf("%q (owner %q, family %v): Lua says reserved %d, owned %d; Go %v, %v", k, owner.key, owner.family, got[2*i], got[2*i+1], reserved, owns)
			}
		}
	}
}

func TestGenKeyShapesAgree(t *testing.T) {
	// C97: lib/keys.lua's keyshapes.gen, with which flip.lua maps the live
	// keys of a tail to the new generation, names the keys that
	// keys.GenKey and keys.GenBucketKey name, which the run writes and
	// Apply maps its ops to.
	lib, err := protocol.Scripts.ReadFile("scripts/lib/keys.lua")
	if err != nil {
		t.Fatal(err)
	}
	src := string(lib) + `
return keyshapes.gen(ARGV[1], ARGV[2], ARGV[3] == '1', ARGV[4])
`
	c := env.Standalone.Client(t)
	ctx := redistest.Ctx(t)
	for _, tc := range []struct {
		live, owner string
		family      bool
		gen         int64
		want        string
	}{
		{"p", "p", false, 7, keys.GenKey("p", 7)},
		{"{t}:k", "{t}:k", false, 12, keys.GenKey("{t}:k", 12)},
		{"p:b", "p", true, 3, keys.GenBucketKey("p", 3, "b")},
		{"{t}:p:a:b", "{t}:p", true, 100000000000001, keys.GenBucketKey("{t}:p", 100000000000001, "a:b")},
		{"p::", "p", true, 1, keys.GenBucketKey("p", 1, ":")},
	} {
		flag := "0"
		if tc.family {
			flag = "1"
		}
		got, err := c.Do(ctx, c.B().Eval().Script(src).Numkeys(0).Arg(tc.live, tc.owner, flag, strconv.FormatInt(tc.gen, 10)).Build()).ToString()
		if err != nil || got != tc.want {
			t.Errorf("keyshapes.gen(%q, %q, %v, %d) = %q, %v; want %q", tc.live, tc.owner, tc.family, tc.gen, got, err, tc.want)
		}
	}
}
