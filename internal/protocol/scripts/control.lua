-- control.lua: record an operator's request for the run holding a lock,
-- fenced by the run's token: a request meant for one run never reaches
-- another that took the lock since.
--
-- The requests have a hash of their own next to the lock ("<lock>:ctl"),
-- the only key of a run operators write: the record, whose token fences
-- what Apply logs, is the run's alone. The requests carry the token of the
-- run they are for, and live as long as the lock.
--
-- KEYS[1]   the lock of the run's first key
-- KEYS[2]   the run's record, next to it
-- KEYS[3]   the run's requests, next to it
-- KEYS[4]   the receipt a publish fenced on the lock leaves
-- ARGV[1]   the token the operator read from the lock
-- ARGV[2..] field/value pairs: cancel, max_rate, paused, action
--
-- Returns {OK}: recorded; the run reads it at its next heartbeat, and its
--              publish refuses to run while a cancel is there.
--         {LOCK_LOST}: the lock does not hold the token: the run ended, or
--               another took over; nothing changed.
--         {TOO_LATE}: the run already published (its receipt holds the token):
--                too late; nothing changed.
local token = ARGV[1]
local receipt = redis.call('GET', KEYS[4])
if receipt == token or receipt == 'read:' .. token then
  return {TOO_LATE}
end
if redis.call('GET', KEYS[1]) ~= token then
  return {LOCK_LOST}
end
if redis.call('HGET', KEYS[2], 'token') ~= token then
  return {LOCK_LOST}
end
if redis.call('HGET', KEYS[3], 'token') ~= token then
  redis.call('DEL', KEYS[3])
end
redis.call('HSET', KEYS[3], 'token', token, unpack(ARGV, 2))
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[3], ttl)
end
return {OK}
