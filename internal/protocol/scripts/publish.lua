-- publish.lua: the fenced atomic publish of one or more rebuilt keys.
--
-- One script, so that the checks and the RENAMEs (or the empty-rebuild
-- deletes) cannot be interleaved with another client's commands. A separate
-- "check the lock, then RENAME" would let a rebuild whose lock expired
-- between the two steps publish its stale snapshot over a successor's newer
-- index.
--
-- Redis does not roll a script back when one of its commands fails: the
-- writes made before the failure stay. So everything that could fail is
-- checked before the first write: the rights of this user on every key
-- (redis.acl_check_cmd, where the server has it), that no command is
-- renamed or disabled, the locks, the run's records, the operator's
-- requests, the temp keys and the logs of changes.
--
-- The old value is UNLINKed (or, to keep it for a rollback, RENAMEd aside)
-- before the RENAME: RENAME frees the value it replaces synchronously, which
-- blocks the server in proportion to its size (about 350 ms for a 1M-field
-- hash); UNLINK frees it in a background thread. Readers cannot see the gap
-- between the two: the script is atomic. RENAME carries the temp key's TTL
-- over, so PERSIST clears it: a live key never inherits an expiry.
--
-- The keys come in sections, in this order, with their sizes in ARGV:
--   L locks; R records (0, or L: the run's, one per lock); C receipts (0
--   or 1); T temp keys; T live keys, in the same order; O orphans: live
--   keys to delete, such as family buckets the run did not produce; P
--   prevs: where the old value of each live key, then of each orphan, is
--   kept (P = T + O when ARGV[14] > 0, else 0); D drops: keys to delete as
--   well, such as prevs of an earlier publish; G metas: the generation of
--   each builder; X logs: the logs of changes of the run's locks (0, or L:
--   log i is lock i's, counted in record i); K requests (0 or 1: the
--   operator's, next to the first lock); Q pairs of an index's pointer and
--   registry (keys.PointerKey, keys.RegistryKey): an index published in
--   Generations mode until now goes back to the plain shape, so its
--   pointer is deleted and its current and previous generations retired
--   after the renames, for a sweep to remove (readers that find no pointer
--   read the plain keys, which this very script publishes). A pointer
--   that holds a group's claim ('group:<name>', SPEC C102) refuses the
--   publish: {IN_GROUP, i, name}, nothing written. S owner stamps
--   (keys.OwnerKey, SPEC C104) of bases another live key can have: each
--   must be absent or name its live key (ARGV[20+5X+G+i]), else the
--   publish is refused, {OWNED, i, kind, value}, nothing written.
--
-- The changes applied to the live keys while the run was in progress (see
-- apply.lua) are in the logs. The run replayed each log onto its temp keys
-- up to an offset; the script replays the rest, the tail, onto the live keys
-- right after the renames, so that no change can fall between the run's
-- last catch-up and the publish. The logs are input from other processes,
-- so the script checks them as the run's catch-up does: the length of each
-- log against the count its record keeps (Apply counts each entry as it
-- appends it) and against the highest count the run saw, and every entry of
-- the tail: a change as keyswap encodes it, whose keys are the builder's.
-- The tail is bounded in entries and in work (ops and arguments): a longer
-- one is refused before any write, and the run catches up again.
--
-- ARGV[1]    token; '' skips the lock checks (an unfenced swap)
-- ARGV[2..11] L, R, C, T, O, P, D, G, X, K
-- ARGV[12]   T characters: '1' where the caller saw temp key i populated,
--            so that a missing key is a loss and must fail closed; '2'
--            where it also gave it a TTL with every write, so that a key
--            without one was lost and re-created; '0' where a missing key
--            is an empty result
-- ARGV[13]   the batches the run wrote (checked against the first record)
-- ARGV[14]   how long to keep the old values, in seconds (0: do not)
-- ARGV[15]   the receipt's TTL in seconds: the script sets the receipt to
--            the token in the same atomic step as the publish, so that a
--            caller whose reply was lost can tell whether it ran
-- ARGV[16]   the time, in milliseconds since the epoch, for the metas
-- ARGV[17..16+5X] per log, five: the entries the run replayed; the highest
--            count of logged entries the run saw; the work of the entries
--            it replayed; the key of the log's builder (a family's prefix);
--            '1' for a family, else '0'
-- ARGV[17+5X] the most entries a tail may have, over all logs
-- ARGV[18+5X] the most work a tail may have, over all logs
-- ARGV[19+5X..18+5X+G] per meta, the key type of a family's keys, or ''
--            for a plain key (recorded in the meta, for a rollback)
-- ARGV[19+5X+G] Q (absent: 0)
-- ARGV[20+5X+G] S (absent: 0), then the live key each stamp must name
--
-- Returns {OK, o1..oT, g1..gG, c}: published; oi = RENAMED, or EMPTIED: live key
--           deleted (empty result); gi the new generation of meta i; c the
--           number of changes (log entries) of the tails replayed.
--         {LOCK_LOST, i}: lock i does not hold the token.
--         {NO_RECORD, i}: record i is gone, or carries no token.
--         {TAMPERED, i}: record i carries another token.
--         {WRITES_LOST, batches}: the first record holds fewer batches than the run
--                  wrote.
--         {ABORTED}: the operator asked the run to cancel.
--         {TEMP_LOST, i}: temp key i was populated and is gone.
--         {RECREATED, i}: temp key i was populated and has no TTL: it was lost and
--                  re-created by a later write (or a write removed its TTL).
--         {NO_RIGHT, cmd, key}: this user may not run cmd on key.
--         {UNKNOWN_CMD, cmd}: cmd does not exist (renamed or disabled).
--         {NOT_META, i}: meta i is not a hash of keyswap's: another key has its
--                  name.
--         {LOG_LOST, i, len, logged}: log i holds fewer entries than were
--                  counted, or its count went back: it lost entries.
--         {UNCOUNTED, i, len, logged}: log i holds more entries than were
--                  counted: entries nobody counted were appended.
--         {BEHIND, i, n, w}: the tails hold n entries of work w, over a bound;
--                  log i is the first with a tail.
--         {OVERRUN, i}: log i reached its bound: changes were not logged.
--         {BAD_LOG, i, e, why}: entry e of log i (LINDEX e) is not a change.
--         {NOT_THE_RUNS, i, e, key}: entry e of log i writes key, which is not its
--                  builder's.
--         {WRONG_TYPE, key, type}: a change in a tail cannot write key, of type.
--         {OWNED, i, kind, value}: stamp i names another live key (kind
--                  'string', value its name), or is of type kind.
-- On every reply but {OK, ...} nothing was written.
-- #include keys
-- #include remove
-- #include changes
-- #include fence
-- #include tail
-- #include owner
local token = ARGV[1]
local L, R, C, T = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local O, P, D, G = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local X, K = tonumber(ARGV[10]), tonumber(ARGV[11])
local populated, keep, now = ARGV[12], tonumber(ARGV[14]), ARGV[16]
local maxEntries, maxWork = tonumber(ARGV[17 + 5 * X]), tonumber(ARGV[18 + 5 * X])
local function logArg(i, j) return ARGV[16 + 5 * (i - 1) + j] end
local at = 0
local function section(n)
  local first = at
  at = at + n
  return first
end
local locks, records, receipts = section(L), section(R), section(C)
local temps, lives, orphans = section(T), section(T), section(O)
local prevs, drops, metas, logs, ctls = section(P), section(D), section(G), section(X), section(K)
local Q = tonumber(ARGV[19 + 5 * X + G] or '0')
local pointers = section(2 * Q)
local S = tonumber(ARGV[20 + 5 * X + G] or '0')
local stamps = section(S)

if redis.acl_check_cmd then
  local function refused(cmd, ...)
    local ok, allowed = pcall(redis.acl_check_cmd, cmd, ...)
    if not ok then
      return {UNKNOWN_CMD, cmd}
    elseif not allowed then
      return {NO_RIGHT, cmd, (...)}
    end
  end
  local function check(cmd, first, n, ...)
    for i = first + 1, first + n do
      local r = refused(cmd, KEYS[i], ...)
      if r then return r end
    end
  end
  -- Every command the script can send, on every key it can send it to.
  local r = check('GET', locks, L) or check('HGET', records, R, 'batches')
    or check('HMGET', records, R, 'logged') or check('HMGET', ctls, K, 'token') or check('SET', receipts, C, token) or check('PTTL', temps, T)
    or check('UNLINK', lives, T) or check('PERSIST', lives, T)
    or check('UNLINK', orphans, O) or check('UNLINK', prevs, P)
    or check('PEXPIRE', prevs, P, '1') or check('UNLINK', drops, D)
    or check('TYPE', metas, G) or check('HINCRBY', metas, G, 'seq', '1')
    or check('HGET', metas, G, 'gen') or check('HSET', metas, G, 'gen', '1')
    or check('HDEL', metas, G, 'prev')
  if not r and P > 0 then
    r = check('EXISTS', lives, T) or check('EXISTS', orphans, O)
  end
  r = r or check('LLEN', logs, X) or check('LRANGE', logs, X, '0', '-1')
  for i = 1, Q do
    local ptr, reg = KEYS[pointers + 2 * i - 1], KEYS[pointers + 2 * i]
    r = r or refused('GET', ptr) or refused('DEL', ptr) or refused('TYPE', reg) or refused('HGETALL', reg)
      or refused('HSET', reg, '1', 'retired:1')
  end
  for i = 1, S do
    r = r or refused('TYPE', KEYS[stamps + i]) or refused('GET', KEYS[stamps + i])
  end
  if r then return r end
  for i = 1, T do
    r = refused('RENAME', KEYS[temps + i], KEYS[lives + i])
    if r then return r end
    if P > 0 then
      r = refused('RENAME', KEYS[lives + i], KEYS[prevs + i])
      if r then return r end
    end
  end
  for i = 1, O do
    if P > 0 then
      r = refused('RENAME', KEYS[orphans + i], KEYS[prevs + T + i])
      if r then return r end
    end
  end
end

-- The owner stamps, before the fence: a base another live key owns is
-- refused as such, whoever holds the lock (as acquire.lua does).
for i = 1, S do
  local r = owner.refused(i, KEYS[stamps + i], ARGV[20 + 5 * X + G + i])
  if r then return r end
end

-- The fence (lib/fence.lua): an unfenced publish has no token, and
-- checks no lock.
local refusal = fence.run(token, locks, token ~= '' and L or 0, records, R,
  R > 0 and ARGV[13] or nil, K > 0 and KEYS[ctls + 1] or nil)
if refusal then return refusal end
-- A meta of another type, or with a seq that is not a number, would fail
-- its HINCRBY after the renames: refuse it first.
for i = 1, G do
  if not fence.meta(KEYS[metas + i]) then
    return {NOT_META, i}
  end
end
local present = {}
for i = 1, T do
  local pttl = redis.call('PTTL', KEYS[temps + i])
  present[i] = pttl ~= -2
  local seen = string.sub(populated, i, i)
  if seen ~= '0' then
    if pttl == -2 then
      return {TEMP_LOST, i}
    elseif pttl == -1 and seen == '2' then
      return {RECREATED, i}
    end
  end
end

-- The tails (lib/tail.lua): counted, read, decoded and checked before any
-- write.
local tailOps, replayed = tail.read(X, function(i)
  return KEYS[logs + i], R > 0 and KEYS[records + i] or nil, tonumber(logArg(i, 1)), tonumber(logArg(i, 2)),
    tonumber(logArg(i, 3)), logArg(i, 4), logArg(i, 5) == '1'
end, maxEntries, maxWork, function(_, key) return key end, function()
  -- After the renames, a live key in T has its temp key's type (or none:
  -- an empty result), an orphan none; any other key keeps its own.
  local after = {}
  for i = 1, T do
    after[KEYS[lives + i]] = 'none'
    if present[i] then
      local r = changes.refused('TYPE', KEYS[temps + i])
      if r then return nil, r end
      after[KEYS[lives + i]] = redis.call('TYPE', KEYS[temps + i])['ok']
    end
  end
  for i = 1, O do
    after[KEYS[orphans + i]] = 'none'
  end
  return after
end)
if not tailOps then return replayed end

-- The generations the switch back from Generations mode retires, read
-- before any write, and the server's clock, in milliseconds, as flip.lua
-- stamps retirements (the sweep measures the grace on it): TIME only when
-- there is one to stamp, checked first, as it is not sent otherwise.
local retiring, stamp = {}, ''
for i = 1, Q do
  -- A pointer that holds a group's claim (claim.lua, SPEC C102) is not
  -- deleted: the group's generations have the names a later run without
  -- the group would allocate, and the claim is what refuses that run.
  if redis.call('TYPE', KEYS[pointers + 2 * i - 1])['ok'] == 'string' then
    local p = redis.call('GET', KEYS[pointers + 2 * i - 1])
    if string.sub(p, 1, 6) == 'group:' then
      return {IN_GROUP, i, string.sub(p, 7)}
    end
  end
  local reg = KEYS[pointers + 2 * i]
  -- A registry of another type is not keyswap's: the sweep reports it.
  if redis.call('TYPE', reg)['ok'] == 'hash' then
    local all = redis.call('HGETALL', reg)
    for j = 1, #all, 2 do
      if all[j + 1] == 'current' or all[j + 1] == 'previous' then
        retiring[#retiring + 1] = {reg, all[j]}
      end
    end
  end
end
if #retiring > 0 then
  if redis.acl_check_cmd then
    local ok, allowed = pcall(redis.acl_check_cmd, 'TIME')
    if not ok then
      return {UNKNOWN_CMD, 'TIME'}
    elseif not allowed then
      return {NO_RIGHT, 'TIME', retiring[1][1]}
    end
  end
  local clock = redis.call('TIME')
  stamp = 'retired:' .. clock[1] .. string.format('%03d', math.floor(tonumber(clock[2]) / 1000))
end

local out = {OK}
local function retire(key, prev)
  if prev then
    redis.call('UNLINK', prev)
    if redis.call('EXISTS', key) == 1 then
      redis.call('RENAME', key, prev)
      redis.call('PEXPIRE', prev, keep * 1000)
    end
  else
    redis.call('UNLINK', key)
  end
end
for i = 1, T do
  local temp, live = KEYS[temps + i], KEYS[lives + i]
  retire(live, P > 0 and KEYS[prevs + i] or nil)
  if present[i] then
    redis.call('RENAME', temp, live)
    redis.call('PERSIST', live)
    out[#out + 1] = RENAMED
  else
    out[#out + 1] = EMPTIED
  end
end
for i = 1, O do
  retire(KEYS[orphans + i], P > 0 and KEYS[prevs + T + i] or nil)
end
for i = 1, D do
  redis.call('UNLINK', KEYS[drops + i])
end
changes.runAll(tailOps)
for i = 1, G do
  local meta = KEYS[metas + i]
  local gen = redis.call('HINCRBY', meta, 'seq', 1)
  local prev = redis.call('HGET', meta, 'gen') or ''
  redis.call('HSET', meta, 'gen', gen, 'at', now)
  local family = ARGV[18 + 5 * X + i]
  if family and family ~= '' then
    redis.call('HSET', meta, 'family', family)
  end
  if keep > 0 then
    redis.call('HSET', meta, 'prev', prev, 'prev_until', tonumber(now) + keep * 1000)
  else
    redis.call('HDEL', meta, 'prev', 'prev_until')
  end
  out[#out + 1] = gen
end
for _, r in ipairs(retiring) do
  redis.call('HSET', r[1], r[2], stamp)
end
for i = 1, Q do
  redis.call('DEL', KEYS[pointers + 2 * i - 1])
end
if C > 0 then
  redis.call('SET', KEYS[receipts + 1], token, 'EX', ARGV[15])
end
out[#out + 1] = replayed
return out
