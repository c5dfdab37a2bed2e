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
-- renamed or disabled, the locks, the run's record, and the temp keys.
--
-- The old value is UNLINKed (or, to keep it for a rollback, RENAMEd aside)
-- before the RENAME: RENAME frees the value it replaces synchronously, which
-- blocks the server in proportion to its size (about 350 ms for a 1M-field
-- hash); UNLINK frees it in a background thread. Readers cannot see the gap
-- between the two: the script is atomic. RENAME carries the temp key's TTL
-- over, so PERSIST clears it: a live key never inherits an expiry.
--
-- The keys come in sections, in this order, with their sizes in ARGV:
--   L locks; R records (0 or 1: the run's own); C receipts (0 or 1);
--   T temp keys; T live keys, in the same order; O orphans: live keys to
--   delete, such as family buckets the run did not produce; P prevs: where
--   the old value of each live key, then of each orphan, is kept (P = T + O
--   when ARGV[13] > 0, else 0); D drops: keys to delete as well, such as
--   prevs of an earlier publish; G metas: the generation of each builder;
--   X logs: the logs of changes of the run's locks.
--
-- The changes applied to the live keys while the run was in progress (see
-- apply.lua) are in the logs. The run replayed each log onto its temp keys
-- up to an offset; the script replays the rest, the tail, onto the live keys
-- right after the renames, so that no change can fall between the run's
-- last catch-up and the publish. The tail is bounded: a longer one is
-- refused before any write, and the run catches up again.
--
-- ARGV[1]    token; '' skips the lock checks (an unfenced swap)
-- ARGV[2..10] L, R, C, T, O, P, D, G, X
-- ARGV[11]   T characters: '1' where the caller saw temp key i populated, so
--           that a missing key is a loss and must fail closed; '2' where it
--           also gave it a TTL with every write, so that a key without one
--           was lost and re-created; '0' where a missing key is an empty
--           result
-- ARGV[12]   the batches the run wrote (checked against the record)
-- ARGV[13]   how long to keep the old values, in seconds (0: do not)
-- ARGV[14]   the receipt's TTL in seconds: the script sets the receipt to
--            the token in the same atomic step as the publish, so that a
--            caller whose reply was lost can tell whether it ran
-- ARGV[15]   the time, in milliseconds since the epoch, for the metas
-- ARGV[16..15+X] X offsets: the entries of each log the run replayed
-- ARGV[16+X] the most entries a tail may have, over all logs
-- ARGV[17+X..16+X+G] per meta, the key type of a family's keys, or '' for a
--            plain key (recorded in the meta, for a rollback)
--
-- Returns {1, o1..oT, g1..gG, c}: published; oi = 1 renamed, 2 live key
--           deleted (empty result); gi the new generation of meta i; c the
--           number of changes (log entries) of the tails replayed.
--         {-1, i}: lock i does not hold the token.
--         {0, i}: temp key i was populated and is gone.
--         {-4, i}: temp key i was populated and has no TTL: it was lost and
--                  re-created by a later write (or a write removed its TTL).
--         {-3, batches}: the record holds fewer batches than the run wrote.
--         {-2, cmd, key}: this user may not run cmd on key.
--         {-5, cmd}: cmd does not exist (renamed or disabled).
--         {-6, i}: meta i is not a hash of keyswap's: another key has its
--                  name.
--         {-7, i, n}: the tails hold n entries, over the bound; log i is
--                  the first with a tail.
--         {-8, key, type}: a change in a tail cannot write key, of type.
--         {-9, i}: log i holds an entry that is not a change.
--         {-10, i}: log i reached its bound: changes were not logged.
-- On every reply but {1, ...} nothing was written.
-- #include changes
local token = ARGV[1]
local L, R, C, T = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local O, P, D, G = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local X = tonumber(ARGV[10])
local populated, keep = ARGV[11], tonumber(ARGV[13])
local at = 0
local function section(n)
  local first = at
  at = at + n
  return first
end
local locks, records, receipts = section(L), section(R), section(C)
local temps, lives, orphans = section(T), section(T), section(O)
local prevs, drops, metas, logs = section(P), section(D), section(G), section(X)

if redis.acl_check_cmd then
  local function refused(cmd, ...)
    local ok, allowed = pcall(redis.acl_check_cmd, cmd, ...)
    if not ok then
      return {-5, cmd}
    elseif not allowed then
      return {-2, cmd, (...)}
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
    or check('SET', receipts, C, token) or check('PTTL', temps, T)
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

if token ~= '' then
  for i = 1, L do
    if redis.call('GET', KEYS[locks + i]) ~= token then
      return {-1, i}
    end
  end
end
if R > 0 then
  local batches = tonumber(redis.call('HGET', KEYS[records + 1], 'batches') or '0')
  if batches < tonumber(ARGV[12]) then
    return {-3, batches}
  end
end
-- A meta of another type, or with a seq that is not a number, would fail
-- its HINCRBY after the renames: refuse it first.
for i = 1, G do
  local meta = KEYS[metas + i]
  local kind = redis.call('TYPE', meta)['ok']
  local seq = kind == 'hash' and redis.call('HGET', meta, 'seq')
  -- seq must be an integer HINCRBY takes and can advance: canonical, and
  -- far from the int64 limit.
  local canonical = seq == '0' or (seq and string.match(seq, '^[1-9]%d*$') and #seq < 19)
  if (kind ~= 'none' and kind ~= 'hash') or (seq and not canonical) then
    return {-6, i}
  end
end
local present = {}
for i = 1, T do
  local pttl = redis.call('PTTL', KEYS[temps + i])
  present[i] = pttl ~= -2
  local seen = string.sub(populated, i, i)
  if seen ~= '0' then
    if pttl == -2 then
      return {0, i}
    elseif pttl == -1 and seen == '2' then
      return {-4, i}
    end
  end
end

-- The tails: read, decoded and checked before any write.
local tail, behind, first, replayed = {}, 0, 0, 0
for i = 1, X do
  local n = redis.call('LLEN', KEYS[logs + i]) - tonumber(ARGV[15 + i])
  if n > 0 then
    behind = behind + n
    if first == 0 then first = i end
  end
end
if behind > tonumber(ARGV[16 + X] or '0') then
  return {-7, first, behind}
end
if behind > 0 then
  -- After the renames, a live key in T has its temp key's type (or none:
  -- an empty result), an orphan none; any other key keeps its own.
  local after = {}
  for i = 1, T do
    after[KEYS[lives + i]] = 'none'
    if present[i] then
      local r = changes.refused('TYPE', KEYS[temps + i])
      if r then return r end
      after[KEYS[lives + i]] = redis.call('TYPE', KEYS[temps + i])['ok']
    end
  end
  for i = 1, O do
    after[KEYS[orphans + i]] = 'none'
  end
  for i = 1, X do
    local entries = redis.call('LRANGE', KEYS[logs + i], ARGV[15 + i], -1)
    for _, e in ipairs(entries) do
      replayed = replayed + 1
      if e == changes.overrun then
        return {-10, i}
      end
      local ops = changes.decode(e)
      if not ops then
        return {-9, i}
      end
      for _, op in ipairs(ops) do
        local r = changes.refused(op[1], op[2], unpack(op[3]))
        if r then return r end
        local kind = after[op[2]]
        if not kind then
          r = changes.refused('TYPE', op[2])
          if r then return r end
          kind = redis.call('TYPE', op[2])['ok']
        end
        r = changes.mistyped(op, kind)
        if r then return r end
        -- The first op on a key decides its type for the ops after it.
        after[op[2]] = changes.types[op[1]]
        tail[#tail + 1] = op
      end
    end
  end
end

local out = {1}
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
    out[#out + 1] = 1
  else
    out[#out + 1] = 2
  end
end
for i = 1, O do
  retire(KEYS[orphans + i], P > 0 and KEYS[prevs + T + i] or nil)
end
for i = 1, D do
  redis.call('UNLINK', KEYS[drops + i])
end
for _, op in ipairs(tail) do
  changes.run(op)
end
for i = 1, G do
  local meta = KEYS[metas + i]
  local gen = redis.call('HINCRBY', meta, 'seq', 1)
  local prev = redis.call('HGET', meta, 'gen') or ''
  redis.call('HSET', meta, 'gen', gen, 'at', ARGV[15])
  local family = ARGV[16 + X + i]
  if family and family ~= '' then
    redis.call('HSET', meta, 'family', family)
  end
  if keep > 0 then
    redis.call('HSET', meta, 'prev', prev, 'prev_until', tonumber(ARGV[15]) + keep * 1000)
  else
    redis.call('HDEL', meta, 'prev', 'prev_until')
  end
  out[#out + 1] = gen
end
if C > 0 then
  redis.call('SET', KEYS[receipts + 1], token, 'EX', ARGV[14])
end
out[#out + 1] = replayed
return out
