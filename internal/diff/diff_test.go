package diff_test

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
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

// TestCompareExactOneSideSmall compares a key within the limit with one
// far past it, each way round: the counts are exact, read from the small
// key and looked up in the large one, and the samples name only what
// differs.
func TestCompareExactOneSideSmall(t *testing.T) {
	env.ForEachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		for _, tc := range []struct {
			name                    string
			liveN, newN             int
			added, removed, changed int64
		}{
			// live: 0..19999. new: 0..1999 without every 10th, every 7th
			// changed: the entries 2000..19999 are removed.
			{"small new", 20000, 2000, 0, 200 + 18000, 257},
			// live: 0..1999; new: 0..19999 without every 10th under 2000,
			// every 7th changed: the entries 2000..19999 are added.
			{"small live", 2000, 20000, 18000, 200, 257},
		} {
			t.Run(tc.name, func(t *testing.T) {
				live, temp := d.Prefix+tc.name+":live", d.Prefix+tc.name+":temp"
				removed := func(i int) bool { return i < 2000 && i%10 == 0 }
				changed := func(i int) bool { return i < 2000 && i%7 == 0 && !removed(i) }
				var n int64
				for i := range 2000 {
					if changed(i) {
						n++
					}
				}
				if n != tc.changed {
					t.Fatalf("the test changes %d entries, and counts on %d", n, tc.changed)
				}
				seed(t, d.Other, "hash", live, tc.liveN, nil, nil)
				seed(t, d.Other, "hash", temp, tc.newN, removed, changed)
				got, err := diff.Compare(redistest.Ctx(t), d.Client, live, temp, diff.Options{Limit: 5000})
				if err != nil {
					t.Fatal(err)
				}
				if !got.Exact || got.Sampled || got.Added != tc.added || got.Removed != tc.removed || got.Changed != tc.changed {
					t.Errorf("got exact %v sampled %v, added %d, removed %d, changed %d; want exact, %d, %d, %d",
						got.Exact, got.Sampled, got.Added, got.Removed, got.Changed, tc.added, tc.removed, tc.changed)
				}
				if len(got.Samples) != diff.DefaultSamples {
					t.Errorf("got %d samples, want %d", len(got.Samples), diff.DefaultSamples)
				}
				for _, s := range got.Samples {
					i, _ := strconv.Atoi(strings.TrimPrefix(s.Entry, "f"))
					ok := s.Kind == "removed" && (removed(i) || i >= tc.newN) ||
						s.Kind == "added" && i >= tc.liveN ||
						s.Kind == "changed" && changed(i)
					if !ok {
						t.Errorf("sample %+v: no such difference", s)
					}
				}
			})
		}
	})
}

// TestSampledCoverage compares two keys past the limit many times: each
// comparison estimates from fresh random samples, and its 95% intervals
// hold the true counts in most of them. (With 400 comparisons, a coverage
// under 90% would be 4 standard deviations away from 95%.)
func TestSampledCoverage(t *testing.T) {
	c := env.Standalone.Client(t)
	p := redistest.Prefix(t)
	live, temp := p+"live", p+"temp"
	// live: 0..19999. new: without every 10th (2000 removed), every 8th
	// of the rest changed, and 20000..21999 added.
	removed := func(i int) bool { return i < 20000 && i%10 == 0 }
	changed := func(i int) bool { return i < 20000 && i%8 == 0 && !removed(i) }
	seed(t, c, "hash", live, 20000, nil, nil)
	seed(t, c, "hash", temp, 22000, removed, changed)
	var wantChanged int64
	for i := range 20000 {
		if changed(i) {
			wantChanged++
		}
	}
	const trials = 400
	covered := map[string]int{}
	for range trials {
		got, err := diff.Compare(redistest.Ctx(t), c, live, temp, diff.Options{Limit: 1000, SampleSize: 300})
		if err != nil {
			t.Fatal(err)
		}
		if got.Exact || !got.Sampled {
			t.Fatalf("got exact %v, sampled %v: want estimates past the limit", got.Exact, got.Sampled)
		}
		for _, m := range []struct {
			name       string
			est, truth int64
			iv         diff.Interval
		}{
			{"added", got.Added, 2000, got.AddedRange},
			{"removed", got.Removed, 2000, got.RemovedRange},
			{"changed", got.Changed, wantChanged, got.ChangedRange},
		} {
			if m.iv.Low > m.est || m.iv.High < m.est {
				t.Fatalf("%s: the interval %+v does not hold the estimate %d", m.name, m.iv, m.est)
			}
			if m.iv.Low <= m.truth && m.truth <= m.iv.High {
				covered[m.name]++
			}
		}
	}
	for _, name := range []string{"added", "removed", "changed"} {
		if covered[name] < trials*9/10 {
			t.Errorf("%s: the 95%% interval held the true count in %d of %d comparisons, want at least 90%%", name, covered[name], trials)
		}
	}
	t.Logf("coverage of %d comparisons: %v", trials, covered)
}
