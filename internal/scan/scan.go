package scan

import (
	"context"
	"errors"
	"iter"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
)

// Options selects the keys to iterate.
type Options struct {
	// Match is the SCAN MATCH glob. Empty matches every key.
	Match string
	// Type is the SCAN TYPE filter ("set", "hash", ...). Empty means any.
	Type string
	// Count is the SCAN COUNT hint. Zero means 1000.
	Count int64
	// InSlot, on a cluster, limits the scan to the master that serves hash
	// slot Slot, when every key sought is in that slot: the other masters'
	// keyspaces are not walked for nothing.
	InSlot bool
	Slot   uint16
}

// Masters returns a client per master node: the one node of a standalone
// deployment, every master of a cluster, in address order. Nodes whose ROLE
// is not "master" are skipped; a node that cannot answer ROLE (miniredis)
// counts as a master.
func Masters(ctx context.Context, client rueidis.Client) ([]rueidis.Client, error) {
	nodes, err := MasterNodes(ctx, client)
	if err != nil {
		return nil, err
	}
	out := make([]rueidis.Client, len(nodes))
	for i, n := range nodes {
		out[i] = n.Client
	}
	return out, nil
}

// Node is a master node: its address, as client.Nodes() names it, and its
// client.
type Node struct {
	Addr   string
	Client rueidis.Client
}

// MasterNodes is Masters with each master's address.
func MasterNodes(ctx context.Context, client rueidis.Client) ([]Node, error) {
	nodes := client.Nodes()
	var out []Node
	for _, addr := range slices.Sorted(maps.Keys(nodes)) {
		node := nodes[addr]
		role, err := node.Do(ctx, node.B().Role().Build()).ToArray()
		if err == nil && len(role) > 0 {
			if r, _ := role[0].ToString(); r != "master" {
				continue
			}
		} else if err != nil && ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		out = append(out, Node{Addr: addr, Client: node})
	}
	if len(out) == 0 {
		return nil, errors.New("no master node to scan")
	}
	return out, nil
}

// Pages yields the keys matching opts, one SCAN reply at a time (possibly
// none: MATCH and TYPE filter after SCAN visits about Count keys), from
// every master in turn. SCAN guarantees every key present throughout the scan is
// returned at least once; a key may come back more than once, and keys
// created or deleted during the scan may or may not be returned. Pages stops
// after yielding the first error.
func Pages(ctx context.Context, client rueidis.Client, opts Options) iter.Seq2[[]string, error] {
	count := opts.Count
	if count <= 0 {
		count = 1000
	}
	return func(yield func([]string, error) bool) {
		masters, err := Masters(ctx, client)
		if err != nil {
			yield(nil, err)
			return
		}
		if opts.InSlot && client.Mode() == rueidis.ClientModeCluster {
			if node, err := masterOf(ctx, client, opts.Slot); err != nil {
				yield(nil, err)
				return
			} else if node != nil {
				masters = []rueidis.Client{node}
			}
		}
		for _, node := range masters {
			var cursor uint64
			for {
				var cmd rueidis.Completed
				base := node.B().Scan().Cursor(cursor)
				switch {
				case opts.Match != "" && opts.Type != "":
					cmd = base.Match(opts.Match).Count(count).Type(opts.Type).Build()
				case opts.Match != "":
					cmd = base.Match(opts.Match).Count(count).Build()
				case opts.Type != "":
					cmd = base.Count(count).Type(opts.Type).Build()
				default:
					cmd = base.Count(count).Build()
				}
				page, err := node.Do(ctx, cmd).AsScanEntry()
				if err != nil {
					yield(nil, err)
					return
				}
				if !yield(page.Elements, nil) {
					return
				}
				if cursor = page.Cursor; cursor == 0 {
					break
				}
			}
		}
	}
}

// masterOf returns the client of the master serving slot, as CLUSTER SLOTS
// says, or nil when it is not among client.Nodes() (the caller then scans
// every master).
func masterOf(ctx context.Context, client rueidis.Client, slot uint16) (rueidis.Client, error) {
	ranges, err := client.Do(ctx, client.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, err
	}
	nodes := client.Nodes()
	for _, r := range ranges {
		v, err := r.ToArray()
		if err != nil || len(v) < 3 {
			continue
		}
		lo, _ := v[0].AsInt64()
		hi, _ := v[1].AsInt64()
		if int64(slot) < lo || int64(slot) > hi {
			continue
		}
		master, err := v[2].ToArray()
		if err != nil || len(master) < 2 {
			return nil, nil
		}
		host, _ := master[0].ToString()
		port, _ := master[1].AsInt64()
		return nodes[net.JoinHostPort(host, strconv.FormatInt(port, 10))], nil
	}
	return nil, nil
}

// EscapeGlob escapes the characters that SCAN MATCH treats specially, so
// that EscapeGlob(prefix) + "*" matches exactly the keys starting with
// prefix.
func EscapeGlob(s string) string {
	if !strings.ContainsAny(s, `*?[]\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ { // bytes, not runes: keys need not be UTF-8
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
