package redistest

import (
	"fmt"
	"strconv"
)

// PublishCall is one call of keyswap's publish script taken apart: its
// keys by section, in the order the script documents them, and its
// arguments.
type PublishCall struct {
	Locks, Records, Receipts, Temps, Lives, Orphans, Prevs, Drops, Metas, Logs, Ctls []string
	// Pointers holds the pairs of an index's pointer and registry (the
	// switch from Generations mode back), sized by the argument after the
	// metas' family types; Stamps the owner stamps (SPEC C104), sized by
	// the argument after it.
	Pointers, Stamps []string
	Args             []string
}

// ParsePublish takes apart the arguments of a command that runs the
// publish script: EVALSHA (or EVAL), then the SHA1 (or the script), the
// number of keys, the keys and the arguments.
func ParsePublish(cmd []string) (PublishCall, error) {
	if len(cmd) < 3 {
		return PublishCall{}, fmt.Errorf("short script call %q", cmd)
	}
	n, err := strconv.Atoi(cmd[2])
	if err != nil || 3+n > len(cmd) {
		return PublishCall{}, fmt.Errorf("bad numkeys in %q", cmd)
	}
	ks, args := cmd[3:3+n], cmd[3+n:]
	const sections = 10 // L, R, C, T, O, P, D, G, X, K
	if len(args) < 1+sections {
		return PublishCall{}, fmt.Errorf("publish args %q: want the token and %d section sizes", args, sections)
	}
	size := make([]int, sections)
	for i := range size {
		if size[i], err = strconv.Atoi(args[1+i]); err != nil {
			return PublishCall{}, fmt.Errorf("publish args %q: section %d: %w", args, i, err)
		}
	}
	order := []int{0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9} // the live keys are a second T section
	var cut [][]string
	at := 0
	for _, s := range order {
		if at+size[s] > len(ks) {
			return PublishCall{}, fmt.Errorf("publish has %d keys, fewer than its sections %v", len(ks), size)
		}
		cut = append(cut, ks[at:at+size[s]])
		at += size[s]
	}
	// ARGV[19+5X+G] (from 1) is Q, then S.
	qi := 18 + 5*size[8] + size[7]
	if qi+1 >= len(args) {
		return PublishCall{}, fmt.Errorf("publish args %q: no count of pointer pairs and stamps at %d", args, qi)
	}
	q, qerr := strconv.Atoi(args[qi])
	st, serr := strconv.Atoi(args[qi+1])
	if qerr != nil || serr != nil || at+2*q+st != len(ks) {
		return PublishCall{}, fmt.Errorf("publish has %d keys, not those of its sections %v, %s pointer pairs and %s stamps", len(ks), size, args[qi], args[qi+1])
	}
	return PublishCall{Locks: cut[0], Records: cut[1], Receipts: cut[2], Temps: cut[3], Lives: cut[4],
		Orphans: cut[5], Prevs: cut[6], Drops: cut[7], Metas: cut[8], Logs: cut[9], Ctls: cut[10],
		Pointers: ks[at : at+2*q], Stamps: ks[at+2*q:], Args: args}, nil
}
