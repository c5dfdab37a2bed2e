-- apply.lua: apply one change (its ops) to the live keys, and log it for
-- the run in progress on those keys, if any, in one atomic step.
--
-- Everything that could fail is checked before the first write, so that a
-- change is applied whole or not at all: the rights of this user on every
-- key (redis.acl_check_cmd, where the server has it), and the type of
-- every key an op writes.
--
-- A run in progress is one that holds a lock and whose record (next to the
-- lock) carries the lock's token: a Rebuilder's run, which replays its log
-- onto its temp keys before it publishes. The log gets the lock's
-- remaining TTL when this script creates it, and the heartbeat renews it
-- with the lock; the run's release deletes it.
--
-- KEYS[1..n]        lock keys
-- KEYS[n+1..2n]     their records
-- KEYS[2n+1..3n]    their logs
-- KEYS[3n+1..]      the live keys the ops write
-- ARGV[1]           n
-- ARGV[2]           the most entries a log may hold; a log that reaches it
--                   gets the entry "!overrun", and nothing more
-- ARGV[3]           the number of ops
-- ARGV[4..]         per op: its lock's index (1..n), its key's index in
--                   KEYS after 3n, the command, the count of args, the args
--
-- Returns {1, l1..ln}: applied; li = 1 the change was logged for the run
--           holding lock i, 0 no run holds it (or no op of the change is
--           its), 2 its log is full (the run will fail).
--         {-2, cmd, key}: this user may not run cmd on key; nothing written.
--         {-5, cmd}: cmd does not exist (renamed or disabled).
--         {-8, key, type}: key holds a type the op cannot write.
-- #include changes
local n, bound, count = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ops, perLock = {}, {}
local at = 4
for _ = 1, count do
  local lock, key, cmd, nargs = tonumber(ARGV[at]), KEYS[3 * n + tonumber(ARGV[at + 1])], ARGV[at + 2], tonumber(ARGV[at + 3])
  local op = {cmd, key, {unpack(ARGV, at + 4, at + 3 + nargs)}}
  at = at + 4 + nargs
  ops[#ops + 1] = op
  perLock[lock] = perLock[lock] or {}
  table.insert(perLock[lock], op)
end

for i = 1, n do
  local r = changes.refused('GET', KEYS[i]) or changes.refused('HGET', KEYS[n + i], 'token')
    or changes.refused('RPUSH', KEYS[2 * n + i], 'x') or changes.refused('PEXPIRE', KEYS[2 * n + i], '1')
    or changes.refused('LLEN', KEYS[2 * n + i]) or changes.refused('PTTL', KEYS[i])
  if r then return r end
end
local kinds = {}
for _, op in ipairs(ops) do
  local r = changes.refused(op[1], op[2], unpack(op[3])) or changes.refused('TYPE', op[2])
  if r then return r end
  r = changes.mistyped(op, kinds[op[2]] or redis.call('TYPE', op[2])['ok'])
  if r then return r end
  -- The first op on a key decides its type for the ops after it: HSET then
  -- SADD on a missing key would write the hash, then fail on the SADD.
  kinds[op[2]] = changes.types[op[1]]
end

for _, op in ipairs(ops) do
  changes.run(op)
end
local out = {1}
for i = 1, n do
  local lock, record, log = KEYS[i], KEYS[n + i], KEYS[2 * n + i]
  local logged = 0
  local holder = perLock[i] and redis.call('GET', lock)
  if holder and redis.call('HGET', record, 'token') == holder then
    local len = redis.call('LLEN', log)
    if len < bound then
      redis.call('RPUSH', log, changes.encode(perLock[i]))
      logged = 1
    else
      if len == bound then
        redis.call('RPUSH', log, changes.overrun)
      end
      logged = 2
    end
    if len == 0 then
      local ttl = redis.call('PTTL', lock)
      if ttl > 0 then
        redis.call('PEXPIRE', log, ttl)
      end
    end
  end
  out[#out + 1] = logged
end
return out
