-- refresh.lua: renew the TTL of a chunk of a run's temp keys.
--
-- The heartbeat renews the locks; this renews the temp keys, a bounded
-- number per call, so that no script scales with the size of a family. It
-- does not extend the lock: the temp keys' TTL is longer than the lock's,
-- and renewed well within it, so a temp key's deadline is never earlier
-- than its lock's.
--
-- KEYS[1]      the run's first lock
-- KEYS[2..]    temp keys
-- ARGV[1]      token
-- ARGV[2]      the temp keys' ttl in seconds
--
-- Returns {OK, s1, s2, ...}: for temp key i,
--           si = TEMP_ABSENT  it does not exist;
--           si = TEMP_ALIVE   it existed with a TTL, now renewed;
--           si = TEMP_CREATED it existed without a TTL, which it now has: it was
--                   created without one, or lost and re-created by a write.
--         {LOCK_LOST}: the lock does not hold the token; nothing changed.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {LOCK_LOST}
end
local out = {OK}
for i = 2, #KEYS do
  local pttl = redis.call('PTTL', KEYS[i])
  if pttl == -2 then
    out[#out + 1] = TEMP_ABSENT
  else
    redis.call('EXPIRE', KEYS[i], ARGV[2])
    out[#out + 1] = pttl == -1 and TEMP_CREATED or TEMP_ALIVE
  end
end
return out
