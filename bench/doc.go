// Command bench measures how fast keyswap rebuilds Redis keys, against the
// fastest way Redis can take the same data, in one run on one machine.
//
//	go run ./bench                    # the default configuration (about 25 minutes, and 11 more for the generations section)
//	go run ./bench -n 20000 -rounds 1 # a smoke run, in seconds
//	go run ./bench -h                 # every flag
//
// Absolute numbers vary too much on shared machines to mean anything alone,
// so the bench reports ratios: each method runs interleaved with the others,
// in rounds (limit, raw, keyswap, naive, limit, raw, ...), on the same
// generated data, against the same server.
//
// # Methods
//
//   - limit: redis-cli --pipe loading pre-generated RESP with 1000 entries
//     per command: the documented mass-insertion path, and the physical
//     limit. The server's single thread is the bottleneck.
//   - raw: the same variadic commands, pipelined through rueidis with
//     rebuild.Defaults().Writers batches in flight, and no lock, lease or swap.
//     The floor of keyswap's own overhead.
//   - keyswap: a full rebuild.Rebuilder run (lock, lease, publish) onto an
//     existing key of the same size.
//   - naive: one command per entry, pipelined the same way: what most
//     hand-written rebuilds do.
//
// # Sections
//
//   - throughput: every method for a hash, a sorted set, a set, a SetIndex of
//     -buckets buckets, and one Rebuilder of all three (hash, sorted set,
//     SetIndex) fed by one source. Every run's final cardinality is checked,
//     and a wrong count fails the bench.
//   - swap: the pause of the publish onto a live 1M-field hash, next to a
//     plain RENAME over it: server time from SLOWLOG, and the worst PING
//     round trip of a concurrent probe.
//   - publish: how long the publish script of a SetIndex family blocks the
//     server, for families of -publish-buckets buckets (1,000, 10,000 and
//     100,000) of -publish-members members each, rebuilt onto a live family
//     of as many buckets, a tenth of which are orphans the publish deletes:
//     its SLOWLOG time, per bucket; the longest of the run's other commands
//     (SLOWLOG of every command of 20 µs or more, named: "EVALSHA
//     heartbeat"); the lease's renewal of the complete family (every temp
//     key's refresh, in chunks, and a heartbeat), sent by the bench just
//     before the publish; and the run's wall time and build throughput.
//   - scaling: limit and keyswap at several sizes: per-entry cost and peak
//     heap should be flat.
//   - knobs: keyswap with BatchSize × Writers around the defaults.
//   - cluster: -cluster-rebuilders independent Rebuilders at once (1, 3 and
//     6), each rebuilding a hash of its own of -cluster-fields fields,
//     spread evenly over the masters of the bench's own 3-master Redis
//     Cluster by their hash tags and sharing one rueidis cluster client,
//     against one Rebuilder on one master: total items/s, speedup, each
//     master's CPU and the client's, which on a small machine compete for
//     the same cores.
//   - online: the multi workload of -online-n items rebuilt while an
//     application commits changes to its truth and applies each with
//     Rebuilder.Apply, -online-rate a second: Apply's latency with and
//     without a run in progress, the rebuild's throughput next to the same
//     rebuild without changes, and its catch-up. With -online-backlog N,
//     each round also runs the rebuild once more, with N changes applied as
//     fast as Apply takes them once its source has given its last item: the
//     catch-up's rate of replayed changes, and the server's and the bench's
//     CPU per change. After every run each entry of every key is compared
//     with the truth, and a lost change fails the bench.
//   - generations: rename-in-place and Generations mode
//     (rebuild.Options.Publish) side by side on the same SetIndex families,
//     each rebuilt onto a live family published in its mode: the publish's
//     server time (the rename publish script against the flip) at
//     -gen-buckets buckets (1,000 to 1,000,000; rename mode only up to
//     -gen-rename-max); the longest command of the whole run, of
//     keyswap's own commands (all but its writes of the index's data) and
//     of what follows the publish (the removal of the previous generation
//     after -gen-grace), from SLOWLOG with a -gen-slowlog threshold, beside
//     the longest command of the raw method writing the same data in the
//     same round (what SLOWLOG counts that is not keyswap's: a set's
//     growth, the hash table resizing, the server preempted); the server
//     and client CPU per entry at -gen-cpu-buckets buckets, both modes
//     against the limit and raw on the same data, the removal of the
//     previous data included, and split at the publish's reply into the
//     build and the removal, each against its like-for-like limit (the
//     new data piped by redis-cli into a server holding the previous
//     generation, then UNLINK, or DEL, of exactly that generation's keys
//     piped too), with the removal's commands from INFO commandstats; and on the bench's own 3-master cluster, a
//     family spread over every master by Generations mode against the same
//     family on one master: items/s and each master's CPU. After every run
//     the bench waits until the previous data is gone and checks that the
//     family holds exactly the new data, and nothing else.
//
// # Output
//
// A Markdown report on stdout and in <out>/<date>.md, the same data as JSON
// in <out>/<date>.json, and a chart in <out>/<date>.png and .svg. A
// progress bar runs on stderr.
//
// # Redis
//
// By default the bench starts its own redis-server on a free loopback port
// (--save "" --appendonly no) and flushes it between runs. The cluster
// section always starts its own cluster of redis-server processes on free
// loopback ports (redis-cli --cluster create), and is left out, with a
// note, when redis-server or redis-cli is not installed. With -addr it
// uses that server instead: it writes and deletes only keys under
// "keyswap-bench:", loads keyswap's scripts (SCRIPT LOAD), and changes
// slowlog settings for the swap and publish sections, restoring them
// afterwards. Never point -addr at a server in production.
package main
