-- touch.lua: compare-and-extend the rebuild lock(s), then refresh the temp
-- keys' TTL. This is Familia's EXTEND_LOCK_SCRIPT and touch in one step.
--
-- A blind EXPIRE would let a stalled rebuild keep extending a lock that a
-- successor already took over, and then swap its stale snapshot on top.
-- The locks are extended FIRST, so a temp key's deadline is never earlier
-- than its lock's: a stall long enough to lose the temp key has already
-- lost the lock (C15).
--
-- KEYS[1..n]    lock keys, n = ARGV[3]
-- KEYS[n+1..]   temp keys
-- ARGV[1]       lock token
-- ARGV[2]       ttl in seconds
-- ARGV[3]       n, the number of lock keys
--
-- Returns {OK, s1, s2, ...}: every lock extended, and for temp key i:
--           si = TEMP_ABSENT  it does not exist;
--           si = TEMP_ALIVE   it existed with a TTL: it has lived since an earlier touch;
--           si = TEMP_CREATED it existed without a TTL, which it now has: it was
--                   created since the last touch. On a key already seen
--                   populated, this means it was lost and re-created by a
--                   later write, so it holds only part of the rebuild.
--         {LOCK_LOST, i}: lock i does not hold the token; nothing changed.
local n = tonumber(ARGV[3])
for i = 1, n do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then
    return {LOCK_LOST, i}
  end
end
for i = 1, n do
  redis.call('EXPIRE', KEYS[i], ARGV[2])
end
local out = {OK}
for i = n + 1, #KEYS do
  local pttl = redis.call('PTTL', KEYS[i])
  if pttl == -2 then
    out[#out + 1] = TEMP_ABSENT
  else
    redis.call('EXPIRE', KEYS[i], ARGV[2])
    out[#out + 1] = pttl == -1 and TEMP_CREATED or TEMP_ALIVE
  end
end
return out
