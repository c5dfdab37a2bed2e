-- rollback.lua: swap the previous value of every key of one or more
-- indexes back in, in one atomic step, fenced by the locks the rollback
-- holds (so that no run of those keys publishes meanwhile).
--
-- A publish with a kept previous value (KeepPrevious) renamed each live key
-- it replaced or deleted to "<base>:rebuild-prev", with a TTL, and recorded
-- in the index's meta the generation it replaced (prev) and until when it is
-- kept (prev_until). This swaps each live key with its prev key, so that a
-- second rollback rolls forward again: a key that has only a prev gets it
-- back, a key that has only a live value (new in the generation rolled
-- back) becomes a prev itself. The prev keys keep what is left of their
-- TTL. Each meta swaps gen and prev.
--
-- Everything that could fail is checked before the first write.
--
-- KEYS[1..L]         locks
-- KEYS[L+1..L+G]     metas, one per index
-- KEYS[L+G+1..]      P triples: a live key, its prev key, a scratch key
-- ARGV[1]            token
-- ARGV[2..4]         L, G, P
-- ARGV[5]            the time, in milliseconds since the epoch
-- ARGV[6..5+P]       the meta index (1..G) of each triple
--
-- Returns {OK, g1..gG}: rolled back; gi is the generation now live.
--         {LOCK_LOST, i}: lock i does not hold the token; nothing changed.
--         {NO_RIGHT, cmd, key} / {UNKNOWN_CMD, cmd}: a right or command is missing.
--         {NO_PREVIOUS, i}: index i keeps no previous generation (none was kept,
--                   or it expired: prev_until passed); nothing changed.
local token = ARGV[1]
local L, G, P = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = tonumber(ARGV[5])
local metas, triples = L, L + G

if redis.acl_check_cmd then
  local function refused(cmd, key, ...)
    local ok, allowed = pcall(redis.acl_check_cmd, cmd, key, ...)
    if not ok then return {UNKNOWN_CMD, cmd} elseif not allowed then return {NO_RIGHT, cmd, key} end
  end
  for i = 1, L do
    local r = refused('GET', KEYS[i])
    if r then return r end
  end
  for i = 1, G do
    local r = refused('HMGET', KEYS[metas + i], 'prev') or refused('HSET', KEYS[metas + i], 'gen', '1')
    if r then return r end
  end
  for j = 0, P - 1 do
    local live, prev, scratch = KEYS[triples + 3 * j + 1], KEYS[triples + 3 * j + 2], KEYS[triples + 3 * j + 3]
    local r = refused('EXISTS', live) or refused('PTTL', prev) or refused('RENAME', live, scratch)
      or refused('RENAME', prev, live) or refused('RENAME', scratch, prev) or refused('RENAME', live, prev)
      or refused('PERSIST', live) or refused('PEXPIRE', prev, '1')
    if r then return r end
  end
end

for i = 1, L do
  if redis.call('GET', KEYS[i]) ~= token then
    return {LOCK_LOST, i}
  end
end
local keep = {}
for i = 1, G do
  local m = redis.call('HMGET', KEYS[metas + i], 'gen', 'prev', 'prev_until')
  local untilMs = tonumber(m[3] or '')
  if not m[2] or m[2] == '' or not untilMs or untilMs <= now then
    return {NO_PREVIOUS, i}
  end
  keep[i] = untilMs - now
end

for j = 0, P - 1 do
  local live, prev, scratch = KEYS[triples + 3 * j + 1], KEYS[triples + 3 * j + 2], KEYS[triples + 3 * j + 3]
  local ttl = keep[tonumber(ARGV[6 + j])]
  local pttl = redis.call('PTTL', prev)
  if pttl > 0 then ttl = pttl end
  local hasLive = redis.call('EXISTS', live) == 1
  if pttl ~= -2 and hasLive then
    redis.call('RENAME', live, scratch)
    redis.call('RENAME', prev, live)
    redis.call('RENAME', scratch, prev)
    redis.call('PERSIST', live)
    redis.call('PEXPIRE', prev, ttl)
  elseif pttl ~= -2 then
    redis.call('RENAME', prev, live)
    redis.call('PERSIST', live)
  elseif hasLive then
    redis.call('RENAME', live, prev)
    redis.call('PEXPIRE', prev, ttl)
  end
end
local out = {OK}
for i = 1, G do
  local meta = KEYS[metas + i]
  local m = redis.call('HMGET', meta, 'gen', 'prev')
  redis.call('HSET', meta, 'gen', m[2], 'prev', m[1], 'at', ARGV[5], 'rolled_back', ARGV[5])
  out[#out + 1] = tonumber(m[2]) or 0
end
return out
