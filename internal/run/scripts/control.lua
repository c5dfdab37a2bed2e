-- control.lua: record an operator's request for the run holding a lock,
-- fenced by the run's token: a request meant for one run never reaches
-- another that took the lock since.
--
-- KEYS[1]   the lock of the run's first key
-- KEYS[2]   the run's record, next to it
-- ARGV[1]   the token the operator read from the lock
-- ARGV[2..] field/value pairs: cancel, max_rate, paused, action
--
-- Returns {1}: recorded; the run reads it at its next heartbeat.
--         {-1}: the lock does not hold the token: the run ended, or
--               another took over; nothing changed.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {-1}
end
if redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then
  return {-1}
end
redis.call('HSET', KEYS[2], unpack(ARGV, 2))
return {1}
