-- heartbeat.lua: renew a run's lease and status, and read the operator's
-- requests and the counts of the logs of changes, in one step.
--
-- Every lock must still hold the run's token: a blind EXPIRE would let a
-- stalled run keep a lock that a successor took over. Every record must
-- still carry it: the record is the run's alone, and Apply logs changes for
-- a run only while its record carries the lock's token, so a record that
-- carries another was forged (or lost and re-created), and changes may
-- have been applied without being logged. The first record counts the
-- batches that reached Redis (every batch's MULTI/EXEC advances it), and
-- the run knows how many of them Redis acknowledged: fewer in the record
-- means Redis lost writes it had acknowledged (a failover to a replica that
-- was behind, a restart from an older snapshot), and the temp keys hold
-- only part of the run.
--
-- The temp keys are not renewed here but in bounded chunks (refresh.lua),
-- with a longer TTL, so that a renewal never runs longer than a few
-- milliseconds whatever the size of a family.
--
-- KEYS[1..n]       lock keys
-- KEYS[n+1..2n]    their records; KEYS[n+1] is the run's own
-- KEYS[2n+1..3n]   their logs of changes
-- KEYS[3n+1]       the operator's requests, next to the first lock
-- ARGV[1]          token
-- ARGV[2]          ttl in seconds
-- ARGV[3]          n
-- ARGV[4]          the batches Redis acknowledged when the heartbeat left
-- ARGV[5..]        field/value pairs of the run's status
--
-- Returns {OK, batches, cancel, max_rate, paused, action, logged1, len1, ...,
--         loggedn, lenn}: renewed; the requests are those of the run's
--         token ('' otherwise); loggedi is the entries Apply counted in log
--         i, leni its length, read in the same step.
--         {LOCK_LOST, i}: lock i does not hold the token; nothing changed.
--         {NO_RECORD, i}: record i is gone, or carries no token: it was lost
--                   (evicted), with the counts it kept; nothing changed.
--         {TAMPERED, i}: record i carries another token; nothing changed.
--         {WRITES_LOST, batches}: the record holds fewer batches than acknowledged.
-- #include fence
local n = tonumber(ARGV[3])
local ctl = KEYS[3 * n + 1]
-- The fence of a publish (lib/fence.lua), for the locks and the records;
-- the batches, which the reply returns, are checked here, and the cancel
-- is read below and returned. The records are opened with the locks and
-- live as long as they do: a missing one was lost with the writes it
-- counted (evicted, or a restart from before the run), and renewing would
-- re-create it without a TTL.
local refusal = fence.run(ARGV[1], 0, n, n, n, nil, nil)
if refusal then return refusal end
local batches = tonumber(redis.call('HGET', KEYS[n + 1], 'batches') or '0')
if batches < tonumber(ARGV[4]) then
  return {WRITES_LOST, batches}
end
for i = 1, 2 * n do
  redis.call('EXPIRE', KEYS[i], ARGV[2])
end
for i = 2 * n + 1, 3 * n + 1 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('EXPIRE', KEYS[i], ARGV[2])
  end
end
if #ARGV > 4 then
  redis.call('HSET', KEYS[n + 1], unpack(ARGV, 5))
end
-- The requests are the operator's, in a hash of their own; those written
-- for another run (another token) are not this run's.
local c = redis.call('HMGET', ctl, 'token', 'cancel', 'max_rate', 'paused', 'action')
if c[1] ~= ARGV[1] then
  c = {}
end
local out = {OK, batches, c[2] or '', c[3] or '', c[4] or '', c[5] or ''}
for i = 1, n do
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[n + i], 'logged') or '0')
  out[#out + 1] = redis.call('LLEN', KEYS[2 * n + i])
end
return out
