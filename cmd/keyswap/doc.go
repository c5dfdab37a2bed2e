// Keyswap is the operator's command for keyswap's atomic key rebuilds: it
// shows the rebuilds in progress, steers and decides them, rolls back what
// they published, and sweeps the temp keys that crashed processes left
// behind and the generations that no reader reads any more.
//
// Usage:
//
//	keyswap status   [connection flags] [-json] [-older-than 1h] [--grace 10s] [--watch [--interval 1s]] [pattern | key | --pattern glob | --index key]
//	keyswap cancel   [connection flags] [-json] <key>
//	keyswap throttle [connection flags] [-json] <key> <items/s>
//	keyswap pause    [connection flags] [-json] <key>
//	keyswap resume   [connection flags] [-json] <key>
//	keyswap diff     [connection flags] [-json] [--limit 100000] [--samples 10] [--max-keys 100] <key>
//	keyswap publish  [connection flags] [-json] [--wait 30s] <key>
//	keyswap discard  [connection flags] [-json] [--wait 30s] <key>
//	keyswap rollback [connection flags] [-json] <key>...
//	keyswap sweep    [connection flags] [--delete | --dry-run] [--pattern '*:rebuild:*'] [--older-than 1h] [--grace 10s] [--plain] [-json] [-progress auto]
//	keyswap version  [-json]
//	keyswap help     [<command> | connect]
//
// Flags take one dash or two and may follow the arguments. 'keyswap help
// <command>' (or 'keyswap <command> --help') prints a command's help and
// its own flags; 'keyswap help connect' the connection flags, which every
// command that talks to Redis shares. A misspelled command or flag gets a
// suggestion. 'keyswap --version' prints the version.
//
// # Connecting
//
// The connection flags are redis-cli's. -h is the host, as in redis-cli:
// help is --help, and -h without a host is a usage error (exit status 2),
// so that a monitoring script whose host variable is empty fails instead of
// reading help as "nothing to sweep".
//
// Where: -u URL (or -redis URL), or -h HOST, -p PORT and -s SOCKET, else
// $REDIS_URL, else redis://127.0.0.1:6379. A URL is a redis:// URL (user,
// password and database included, as in redis://user:password@host:6379/2),
// a rediss:// URL for TLS, a unix:// URL or the absolute path of a unix
// socket (unix:///run/redis.sock?db=2, /run/redis.sock), or a bare
// host:port. Repeat -u, or separate URLs with commas, to give several seeds
// of a Redis Cluster; a single seed finds the whole cluster too. With the
// URL parameter master_set, as in redis://10.0.0.5:26379?master_set=mymaster,
// the addresses are those of Redis Sentinels, and keyswap connects to the
// master they monitor under that name (the sentinels are asked without
// AUTH). -u wins over -h, -p and -s, whatever their order, with a warning;
// -s wins over -h and -p; -h alone means port 6379, -p alone host
// 127.0.0.1. Each connection attempt times out after 3 seconds (override
// with the URL parameter dial_timeout=10s).
//
// -n DB selects a database, over the URL's. --user NAME logs in as the ACL
// user NAME instead of the URL's user (else "default"). The password is the
// first of:
//
//  1. the one --askpass reads: typed on the terminal without echo, or,
//     when stdin is not a terminal, its first line (echo "$PW" | keyswap
//     status --askpass), as redis-cli does;
//  2. -a PASSWORD, or --pass PASSWORD;
//  3. the URL's;
//  4. $KEYSWAP_PASSWORD;
//  5. $REDISCLI_AUTH, redis-cli's variable.
//
// A password given with -a, --pass or in a -u URL can be read by other
// users of the machine in the process list, so keyswap warns about it on
// stderr, as redis-cli does (--no-auth-warning silences that); the
// environment and --askpass keep it out of the command line. A command that
// keyswap suggests never repeats a password: it keeps the connection flags
// and asks for the password with --askpass.
//
// --tls, or a rediss:// URL, connects with TLS. The server's certificate is
// verified against the system's CAs or those of --cacert FILE, and against
// the host each server is reached at or the name given by --sni NAME;
// --insecure skips the verification. --cert FILE and --key FILE give a
// client certificate, for a server that requires one (tls-auth-clients). A
// plain connection that a server ends before it answers, as a TLS port does,
// is reported with "is this a TLS port? try --tls".
//
// # Status
//
// status names the server it read, then lists the rebuild locks
// (<key>:rebuild-lock) with their TTL and
// the start of their token, and the temp keys (<key>:rebuild:<unix>:<nonce>)
// with their age, TTL, type, size, memory, whether a held lock protects
// them, and whether the sweep would delete them, by the sweep's own rule.
// It scans the keyspace once. The optional pattern is a Redis glob matched
// against the live key (on a cluster, with and without the hash tag keyswap
// adds). When there are sweep candidates, status prints the sweep command
// that lists them, limited to the temp keys of the live keys the pattern
// selects, with the connection flags: 'keyswap status -h 10.0.0.5 -a pw
// "users:*"' suggests
//
//	keyswap sweep --older-than 1h0m0s --pattern 'users:*:rebuild:*' -h 10.0.0.5 --askpass
//
// For each run of a rebuild.Rebuilder (a lock whose record, <lock>:run,
// carries the lock's token), status also shows what its heartbeats write
// there every second: owner, phase, age, items, entries, the current rate
// (over about the last five seconds) and the average since the start,
// limit, ETA, the time since the last heartbeat and the last item, the
// changes applied meanwhile, the operator's requests pending, and the
// generation of each of its keys. Every index published (its meta,
// <key>:rebuild-gen) is listed with its generation, the one kept for a
// rollback and until when, and whether 'keyswap rollback' would roll it
// back now, and if not, why.
//
// An index published in Generations mode (rebuild.Options.Publish =
// rebuild.Generations) has a pointer, <key>:rebuild-ptr, naming its
// current generation, and a registry of its generations,
// <key>:rebuild-gens. Status lists such indexes in a GENERATIONS table
// (and in -json, each index's "mode" and "generations"): the mode, the
// current generation, the previous one kept for a rollback, the retired
// ones waiting for their removal and since when, the builds in progress
// with the start of their run's token, those abandoned by a run that is
// gone, and whether the index is switching from rename-in-place (its
// plain key is still there beside the pointer) or its registry is
// corrupt. An index in a group leaves "group:<name>" in its pointer
// outside the group: a scan lists that pointer in mode "group", noting
// the group; status or rollback of the index without --group fails,
// naming the group to pass. A generation retired more than --grace ago (10s), or abandoned,
// is a sweep candidate, by the sweep's own rule.
//
// An argument without a glob character (or --index) is one live key:
// status then reads that key's lock, run and index without a scan, at the
// same cost whatever the size of the keyspace, and does not look for
// orphaned temp keys. --pattern takes a glob even without glob characters.
// --watch shows the status again every second (--interval) until
// interrupted; with -json, one JSON object per line.
//
// -json prints a stable JSON document, described in 'keyswap status --help'.
//
// # Steering a run
//
// cancel, throttle, pause and resume find the run that holds the lock of
// <key>, any key of the run (a family's prefix for a family), and write a
// request into its record with one script fenced by the run's token, so
// that a request never reaches a later run of the same keys. The run reads
// its requests at every heartbeat: cancel ends it with rebuild.ErrAborted
// and publishes nothing; throttle N caps the items per second it pulls (0
// goes back to its Options.MaxRate); pause stops its source, keeping its
// lease, until resume.
//
// # Held runs
//
// A run built with rebuild.Rebuilder.Build stops, held, before its
// publish. diff compares its temp keys with the live keys, key by key and
// bucket by bucket, without blocking Redis: it reads at most --limit
// entries of each key and estimates from samples past that. publish and
// discard decide it, then wait up to --wait for the run to end, and report
// the outcome from the keys' generations.
//
// # Rollback
//
// rollback swaps back the values that the last publish with
// Options.KeepPrevious replaced, for every key given, in one atomic step
// fenced by their locks; a family's buckets come back or go as they were.
// It prints the generation now live; a second rollback rolls forward. An
// index in Generations mode is rolled back by a flip of its pointer to its
// previous generation, whatever its size; the one rolled back becomes the
// previous one, so a second rollback flips forward. One rollback takes
// indexes of one mode.
//
// # Sweep
//
// sweep is a dry run unless --delete is given: it prints the orphaned temp
// keys it would delete (TTL-less, unlocked, older than --older-than), then
// "would delete N keys (dry run; pass --delete to delete)". With --delete it
// deletes them and prints "deleted N keys". On a terminal, a large sweep
// shows a progress spinner on stderr.
//
// It also removes, in small chunks, the dead generations of the indexes in
// Generations mode whose temp keys --pattern matches: those retired more
// than --grace ago (10s by default, as rebuild.Options.Grace) and those a
// run built and abandoned; never the current or the previous one, nor a
// build in progress. It prints each generation it removed (or would
// remove) and each it kept, with why; -json lists them in "generations".
// With --plain it also deletes what indexes that switched from
// rename-in-place left in the plain shape, while their pointer exists:
// give it once every reader resolves the pointer. On Redis Cluster the
// keys X and {X} share the base {X} that names the registry: the sweep
// takes the index from the base's owner stamp (<base>:rebuild-owner), and
// leaves alone, exiting 1, a base whose stamp does not name one of them.
//
// Do not sweep during a rolling upgrade from a version without the rebuild
// lock. Such versions hold no lock and put no TTL on their temp keys, so
// the sweep cannot tell their running rebuilds from abandoned ones: it
// deletes their temp keys, and the old code then publishes a missing temp
// key as an empty rebuild, deleting the live index.
//
// # JSON
//
// Every command takes -json and prints one JSON object on stdout instead of
// lines and tables; those that talk to Redis name the server they read in
// "server" ({"mode": "standalone", "addrs": ["10.0.0.5:6379"], "db": 0}).
// A command that fails prints its error on stderr as without -json, and on
// stdout the object {"command": "cancel", "error": "...", "kind": "no_run",
// "exit_status": 4}, whose kind names the exit status: error, usage,
// no_run, conflict, no_previous or timeout.
//
// The JSON of every command names keys exactly. Redis names are bytes:
// a name that is valid UTF-8 is a JSON string, as in "key":
// "users:by-email:rebuild-lock"; any other name (one holding the byte 0xff,
// say) is given instead as the standard base64 of its bytes, in a field
// named with "_base64" appended ("key_base64", "base_base64",
// "lock_key_base64", "pattern_base64"), and the plain field is left out. A
// script that decodes the names this way deletes exactly the keys listed.
//
// # Exit status
//
//	0  success; for status and a sweep without --delete, nothing to sweep
//	1  an error: Redis unreachable, authentication failed, a command failed,
//	   a corrupt registry of generations (sweep)
//	2  a usage error
//	3  status or a sweep without --delete found sweep candidates: temp
//	   keys, or generations to remove
//	4  no rebuild is in progress for the key given
//	5  the run is not held (diff, publish, discard), or a run holds the
//	   lock (rollback); nothing changed
//	6  rollback: no previous generation is kept; nothing changed
//	7  publish, discard: the run had not ended within --wait
//
// A sweep with --delete exits 0 once it has deleted every key it found.
// Monitoring can run 'keyswap status' and alert on 3. Errors go to stderr,
// prefixed with "keyswap: ", e.g.
//
//	keyswap: cannot reach Redis at 127.0.0.1:1: dial tcp 127.0.0.1:1: connect: connection refused
//	keyswap: authentication failed for user ops at 10.0.0.5:6379: WRONGPASS invalid username-password pair or user is disabled. (the password came from $REDISCLI_AUTH)
package main
