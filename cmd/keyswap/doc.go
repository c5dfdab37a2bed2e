// Keyswap is the operator's command for keyswap's atomic key rebuilds: it
// shows the rebuilds in progress and sweeps the temp keys that crashed
// processes left behind.
//
// Usage:
//
//	keyswap status [-redis URL]... [-json] [-older-than 1h] [pattern]
//	keyswap sweep  [-redis URL]... [--delete] [--pattern '*:rebuild:*'] [--older-than 1h] [-json] [-progress auto]
//
// Flags take one dash or two and may follow the arguments. 'keyswap
// <command> -h' prints a command's full help.
//
// # Connecting
//
// -redis takes a redis:// or rediss:// URL (user, password and database
// included) or a bare host:port. Repeat it, or separate URLs with commas, to
// give several seeds of a Redis Cluster; a single seed finds the whole
// cluster too. Without -redis, $REDIS_URL is used, else
// redis://127.0.0.1:6379. Each connection attempt times out after 3 seconds
// (override with the URL parameter dial_timeout=10s).
//
// # Status
//
// status lists the rebuild locks (<key>:rebuild-lock) with their TTL and
// the start of their token, and the temp keys (<key>:rebuild:<unix>:<nonce>)
// with their age, TTL, type, size, memory, whether a held lock protects
// them, and whether the sweep would delete them; the sweep's own dry run
// decides that last column. The optional pattern is a Redis glob matched
// against the live key (on a cluster, with and without the hash tag keyswap
// adds). -json prints a stable JSON document, described in 'keyswap status
// -h'.
//
// # Sweep
//
// sweep is a dry run unless --delete is given: it prints the orphaned temp
// keys it would delete (TTL-less, unlocked, older than --older-than), then
// "would delete N keys (dry run; pass --delete to delete)". With --delete it
// deletes them and prints "deleted N keys". On a terminal, a large sweep
// shows a progress spinner on stderr.
//
// Do not sweep during a rolling upgrade from a version without the rebuild
// lock: its running rebuilds look abandoned, and deleting their temp keys
// makes them delete their live index (contract rule C41).
//
// # Exit status
//
// 0 on success, 1 on an error (Redis unreachable, a command failed), 2 on
// a usage error. Errors go to stderr, prefixed with "keyswap: ", e.g.
//
//	keyswap: cannot reach Redis at 127.0.0.1:1: dial tcp 127.0.0.1:1: connect: connection refused
package main
