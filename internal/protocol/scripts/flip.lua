-- flip.lua: the publish of a run in Generations mode. The run wrote its
-- indexes' data under a new generation each; this script, fenced as
-- publish.lua is, points each index's pointer at its new generation, in
-- one atomic step: readers that resolve the pointer see every index old or
-- every index new. It touches O(number of indexes) keys, whatever the size
-- of the data: nothing is renamed, nothing deleted (the old generation is
-- removed afterwards, in chunks, once readers no longer use it).
--
-- The keys come in sections, all in the locks' slot:
--   L locks; L records (one per lock, the run's); 1 requests (the
--   operator's, next to the first lock); L logs (the logs of changes of
--   the locks); then N triples per index: its pointer, its registry, its
--   meta; 1 receipt; L cut-over marks (keys.CutOverKey of each lock),
--   which the flip deletes when they hold the token; and N manifests
--   (keys.ManifestKey of each index's new generation), in which the flip
--   lists the keys of a family its tail writes.
-- ARGV[1]   the token
-- ARGV[2]   L
-- ARGV[3]   N
-- ARGV[4]   the batches the run wrote, checked against the first record;
--           '' when the writes are counted elsewhere (on a cluster, per
--           slot, checked by the caller before the flip)
-- ARGV[5]   '1' to keep the old generation as 'previous' (for a
--           rollback), '0' to retire it
-- ARGV[6]   the time, in milliseconds since the epoch, for the metas (the
--           retirements are stamped with the server's clock, TIME, which
--           the sweep measures the grace on)
-- ARGV[7]   the receipt's TTL in seconds
-- ARGV[8..7+N] the new generation of each index
-- ARGV[8+N..7+N+5L] per log, five: the entries the run replayed onto its
--           new generation; the highest count of logged entries it saw;
--           the work of the entries it replayed; the key of the log's
--           builder (a family's prefix); '1' for a family, else '0'
-- ARGV[8+N+5L] the most entries a tail may have, over all logs: 0 when the
--           run's keys are not all in this slot (a cluster's family
--           without a hash tag)
-- ARGV[9+N+5L] the most work a tail may have, over all logs
--
-- The changes logged for the run after those it replayed, the tail, are
-- replayed here onto the keys of the new generations (log i's onto index
-- i's), before the pointers move, with the code publish.lua replays its
-- tail with (lib/tail.lua): so that a steady stream of Apply never starves
-- the flip. A tail over the bounds is refused with BEHIND, and the run
-- catches up again. The keys the tail writes in a family's new generation
-- are added to its manifest's set in the same step, as genapply.lua adds
-- those it writes (changes.manifests): with the run's list, the manifest
-- then holds every key of the generation, whether the flip replayed a tail
-- or not.
--
-- Returns {OK, m1..mN, k1, r.., k2, r.., ..., c}: flipped; mi the new
--           meta generation of index i; ki the number of generations
--           retired from index i, followed by them; c the number of
--           changes (log entries) of the tail replayed.
--         {LOCK_LOST, i}: lock i does not hold the token.
--         {NO_RECORD, i}, {TAMPERED, i}: record i is gone, or carries
--                  another token.
--         {WRITES_LOST, batches}: the first record holds fewer batches than
--                  the run wrote.
--         {ABORTED}: the operator asked the run to cancel.
--         {LOG_LOST, i, len, logged}, {UNCOUNTED, i, len, logged}: log i
--                  lost entries, or holds entries nobody counted.
--         {BEHIND, i, n, w}: the tails hold n entries of work w, over a
--                  bound; log i is the first with a tail.
--         {OVERRUN, i}, {BAD_LOG, i, e, why}, {NOT_THE_RUNS, i, e, key},
--                  {WRONG_TYPE, key, type}, {NO_RIGHT, cmd, key},
--                  {UNKNOWN_CMD, cmd}: as publish.lua, of the tail.
--         {GEN_LOST, i}: the registry of index i no longer marks its new
--                  generation as built by this run.
--         {NOT_META, i}: meta i is another key.
--         {BAD_REGISTRY, i, why}: manifest i, in which the tail's keys of
--                  index i are to be listed, is not a set.
-- On every reply but {OK, ...} nothing was written.
-- #include keys
-- #include remove
-- #include changes
-- #include fence
-- #include tail
local token, L, N = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local batches, keep, now, receiptTTL = ARGV[4], ARGV[5] == '1', ARGV[6], ARGV[7]
local locks, records, ctl, logs, indexes = 0, L, 2 * L, 2 * L + 1, 3 * L + 1
local receipt = KEYS[indexes + 3 * N + 1]
local marks = indexes + 3 * N + 1
local manifests = marks + L
local function gen(i) return ARGV[7 + i] end
local function logArg(i, j) return ARGV[7 + N + 5 * (i - 1) + j] end
local maxEntries, maxWork = tonumber(ARGV[8 + N + 5 * L]), tonumber(ARGV[9 + N + 5 * L])

-- The fence (lib/fence.lua), as publish.lua runs it.
local refusal = fence.run(token, locks, L, records, L, batches ~= '' and batches or nil, KEYS[ctl + 1])
if refusal then return refusal end
-- The tails (lib/tail.lua), log i's onto index i's new generation; a
-- family's keys are noted for its manifest.
local listed = changes.manifests()
local tailOps, replayed = tail.read(L, function(i)
  return KEYS[logs + i], KEYS[records + i], tonumber(logArg(i, 1)), tonumber(logArg(i, 2)),
    tonumber(logArg(i, 3)), logArg(i, 4), logArg(i, 5) == '1'
end, maxEntries, maxWork, function(i, key)
  local family = logArg(i, 5) == '1'
  local k = keyshapes.gen(key, logArg(i, 4), family, gen(i))
  if family then listed.add(i, k) end
  return k
end, function() return {} end)
if not tailOps then return replayed end
-- The server's clock, in milliseconds, read before any write (a TIME the
-- user may not run fails the script here, having written nothing): the
-- sweep reads TIME with the registry and compares, so no client's clock
-- shortens the grace.
local clock = redis.call('TIME')
local stamp = 'retired:' .. clock[1] .. string.format('%03d', math.floor(tonumber(clock[2]) / 1000))
for i = 1, N do
  local ptr, reg, meta = KEYS[indexes + 3 * i - 2], KEYS[indexes + 3 * i - 1], KEYS[indexes + 3 * i]
  -- Read before any write: a pointer or a registry of another type fails
  -- the script here, not halfway through the flips. A group's claim
  -- (claim.lua, SPEC C102) refuses the flip.
  local claimed = redis.call('GET', ptr)
  if claimed and string.sub(claimed, 1, 6) == 'group:' then
    return {IN_GROUP, i, string.sub(claimed, 7)}
  end
  if redis.call('HGET', reg, gen(i)) ~= 'building:' .. token then
    return {GEN_LOST, i}
  end
  if not fence.meta(meta) then
    return {NOT_META, i}
  end
  local why, r = listed.unfit(i, KEYS[manifests + i])
  if r then return r end
  if why then
    return {BAD_REGISTRY, i, why}
  end
end

-- The run's cut-over marks (Apply waits while one is set) go first: a DEL
-- this user may not run fails the script before any other write.
for i = 1, L do
  local mark = KEYS[marks + i]
  if redis.call('GET', mark) == token then
    redis.call('DEL', mark)
  end
end
changes.runAll(tailOps)
for i = 1, N do
  listed.list(i, KEYS[manifests + i])
end
local out, retired = {OK}, {}
for i = 1, N do
  local ptr, reg, meta = KEYS[indexes + 3 * i - 2], KEYS[indexes + 3 * i - 1], KEYS[indexes + 3 * i]
  local old = redis.call('GET', ptr)
  redis.call('SET', ptr, gen(i))
  redis.call('HSET', reg, gen(i), 'current')
  -- At most one previous generation: an earlier one retires (all of
  -- them without keep).
  local gone = {}
  local all = redis.call('HGETALL', reg)
  for j = 1, #all, 2 do
    if all[j + 1] == 'previous' and all[j] ~= old then
      redis.call('HSET', reg, all[j], stamp)
      gone[#gone + 1] = tonumber(all[j])
    end
  end
  if old and old ~= gen(i) then
    if keep then
      redis.call('HSET', reg, old, 'previous')
    else
      redis.call('HSET', reg, old, stamp)
      gone[#gone + 1] = tonumber(old)
    end
  end
  retired[i] = gone
  local g = redis.call('HINCRBY', meta, 'seq', 1)
  redis.call('HSET', meta, 'gen', g, 'at', now)
  redis.call('HDEL', meta, 'prev', 'prev_until')
  out[#out + 1] = g
end
for i = 1, N do
  out[#out + 1] = #retired[i]
  for _, g in ipairs(retired[i]) do
    out[#out + 1] = g
  end
end
redis.call('SET', receipt, token, 'EX', receiptTTL)
out[#out + 1] = replayed
return out
