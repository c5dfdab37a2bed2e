-- heartbeat.lua: renew a run's lease and status, and read the operator's
-- requests, in one step.
--
-- Every lock must still hold the run's token: a blind EXPIRE would let a
-- stalled run keep a lock that a successor took over. The record counts the
-- batches that reached Redis (every batch's MULTI/EXEC advances it), and the
-- run knows how many of them Redis acknowledged: fewer in the record means
-- Redis lost writes it had acknowledged (a failover to a replica that was
-- behind, a restart from an older snapshot), and the temp keys hold only part
-- of the run.
--
-- The temp keys are not renewed here but in bounded chunks (refresh.lua),
-- with a longer TTL, so that a renewal never runs longer than a few
-- milliseconds whatever the size of a family.
--
-- KEYS[1..n]       lock keys
-- KEYS[n+1..2n]    their records; KEYS[n+1] is the run's own
-- KEYS[2n+1..3n]   their logs of changes
-- ARGV[1]          token
-- ARGV[2]          ttl in seconds
-- ARGV[3]          n
-- ARGV[4]          the batches Redis acknowledged when the heartbeat left
-- ARGV[5..]        field/value pairs of the run's status
--
-- Returns {1, batches, cancel, max_rate, paused, action, log lengths...}:
--         renewed.
--         {-1, i}: lock i does not hold the token; nothing changed.
--         {-3, batches}: the record holds fewer batches than acknowledged,
--                        or is gone ({-3, 0}).
local n = tonumber(ARGV[3])
for i = 1, n do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then
    return {-1, i}
  end
end
-- The record is opened with the locks and lives as long as they do: a
-- missing one was lost with the writes it counted (evicted, or a restart
-- from before the run), and renewing would re-create it without a TTL.
if redis.call('EXISTS', KEYS[n + 1]) == 0 then
  return {-3, 0}
end
local batches = tonumber(redis.call('HGET', KEYS[n + 1], 'batches') or '0')
if batches < tonumber(ARGV[4]) then
  return {-3, batches}
end
for i = 1, 2 * n do
  redis.call('EXPIRE', KEYS[i], ARGV[2])
end
for i = 2 * n + 1, 3 * n do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('EXPIRE', KEYS[i], ARGV[2])
  end
end
if #ARGV > 4 then
  redis.call('HSET', KEYS[n + 1], unpack(ARGV, 5))
end
-- The requests have names of their own: the status written above has a
-- "rate" of its own (the items per second so far), which a request of the
-- same name would read back as a limit.
local c = redis.call('HMGET', KEYS[n + 1], 'cancel', 'max_rate', 'paused', 'action')
local out = {1, batches, c[1] or '', c[2] or '', c[3] or '', c[4] or ''}
for i = 2 * n + 1, 3 * n do
  out[#out + 1] = redis.call('LLEN', KEYS[i])
end
return out
