package diff_test

import (
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/keyswap/keyswap/internal/diff"
	"github.com/keyswap/keyswap/internal/redistest"
	"github.com/redis/rueidis"
)

var env *redistest.Env

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, &env, true)) }

// seed writes n entries 0..n-1 of kind to key: fields "f<i>" = "v<i>",
// members "m<i>" with score i, or members "m<i>"; skip leaves entries out,
// and bump changes their value (score + 0.5, or value + "x").
func seed(t *testing.T, c rueidis.Client, kind, key string, n int, skip, bump func(int) bool) {
	t.Helper()
	var cmds rueidis.Commands
	for start := 0; start < n; start += 1000 {
		var args []string
		for i := start; i < min(n, start+1000); i++ {
			if skip != nil && skip(i) {
				continue
			}
			changed := bump != nil && bump(i)
			switch kind {
			case "hash":
				v := fmt.Sprint("v", i)
				if changed {
					v += "x"
				}
				args = append(args, fmt.Sprint("f", i), v)
			case "zset":
				s := float64(i)
				if changed {
					s += 0.5
				}
				args = append(args, fmt.Sprint(s), fmt.Sprint("m", i))
			case "set":
				args = append(args, fmt.Sprint("m", i))
			}
		}
		if len(args) == 0 {
			continue
		}
		name := map[string]string{"hash": "HSET", "zset": "ZADD", "set": "SADD"}[kind]
		cmds = append(cmds, c.B().Arbitrary(name).Keys(key).Args(args...).Build())
	}
	for _, r := range c.DoMulti(redistest.Ctx(t), cmds...) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCompare(t *testing.T) {
	// live holds entries 0..n-1; the new key lacks every 10th (removed),
	// changes every 7th that it has (changed, but for a set), and adds
	// n..n+49 (added).
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		for _, kind := range []string{"hash", "zset", "set"} {
			for _, tc := range []struct {
				name  string
				n     int
				limit int
			}{{"exact", 2000, 0}, {"sampled", 20000, 5000}} {
				t.Run(kind+"/"+tc.name, func(t *testing.T) {
					live, temp := d.Prefix+kind+tc.name+":live", d.Prefix+kind+tc.name+":temp"
					removed := func(i int) bool { return i%10 == 0 }
					changed := func(i int) bool { return kind != "set" && i%7 == 0 && !removed(i) }
					seed(t, d.Other, kind, live, tc.n, nil, nil)
					seed(t, d.Other, kind, temp, tc.n+50, func(i int) bool { return i < tc.n && removed(i) }, changed)
					got, err := diff.Compare(redistest.Ctx(t), d.Client, live, temp, diff.Options{Limit: tc.limit, SampleSize: 2000})
					if err != nil {
						t.Fatal(err)
					}
					wantRemoved, wantChanged := int64(0), int64(0)
					for i := range tc.n {
						if removed(i) {
							wantRemoved++
						} else if changed(i) {
							wantChanged++
						}
					}
					wantNew := int64(tc.n) - wantRemoved + 50
					if got.Type != kind || got.LiveType != kind || got.LiveSize != int64(tc.n) || got.NewSize != wantNew {
						t.Errorf("types %s/%s, sizes live %d new %d; want %s, %d and %d", got.Type, got.LiveType, got.LiveSize, got.NewSize, kind, tc.n, wantNew)
					}
					if len(got.Samples) != diff.DefaultSamples {
						t.Errorf("got %d samples, want %d", len(got.Samples), diff.DefaultSamples)
					}
					for _, s := range got.Samples {
						if !slices.Contains([]string{"added", "removed", "changed"}, s.Kind) {
							t.Errorf("sample %+v: unknown kind", s)
						}
					}
					if tc.limit == 0 {
						want := diff.Key{Live: live, Temp: temp, Type: kind, LiveType: kind, LiveSize: int64(tc.n), NewSize: wantNew,
							Added: 50, Removed: wantRemoved, Changed: wantChanged, Exact: true}
						got.Samples = nil
						if d := cmp.Diff(want, got); d != "" {
							t.Errorf("exact comparison (-want +got):\n%s", d)
						}
						return
					}
					if got.Exact {
						t.Error("Exact: got true past the limit, want false (estimates)")
					}
					// Estimates from 2000 of 20000 entries: within a
					// tolerance that holds with overwhelming probability
					// (several standard deviations).
					near := func(what string, got, want, tol int64) {
						if got < want-tol || got > want+tol {
							t.Errorf("%s: estimated %d, want %d ± %d", what, got, want, tol)
						}
					}
					near("removed", got.Removed, wantRemoved, 500)
					near("changed", got.Changed, wantChanged, 500)
					near("added", got.Added, 50, 150)
				})
			}
		}
	})
}

func TestSizes(t *testing.T) {
	c := env.Standalone.Client(t)
	p := redistest.Prefix(t)
	seed(t, c, "hash", p+"h", 3, nil, nil)
	seed(t, c, "set", p+"s", 5, nil, nil)
	redistest.Do(t, c, c.B().Set().Key(p+"str").Value("x").Build())
	redistest.Do(t, c, c.B().Rpush().Key(p+"l").Element("a", "b").Build())
	types, sizes, err := diff.Sizes(redistest.Ctx(t), c, []string{p + "h", p + "s", p + "str", p + "l", p + "none"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"hash", "set", "string", "list", "none"}; !slices.Equal(types, want) {
		t.Errorf("types: got %v, want %v", types, want)
	}
	if want := []int64{3, 5, 1, 2, 0}; !slices.Equal(sizes, want) {
		t.Errorf("sizes: got %v, want %v", sizes, want)
	}
}
