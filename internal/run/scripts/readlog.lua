-- readlog.lua: read the next entries of a run's log of changes, the log's
-- length, and what the lock's record says of it (the entries Apply counted,
-- their work, and the run's token), in one atomic step, for the catch-up.
-- It only reads: a rerun after a lost reply reads the same.
--
-- KEYS[1]   the log
-- KEYS[2]   the record of its lock
-- ARGV[1]   the index of the first entry to read
-- ARGV[2]   the index of the last
--
-- Returns {entries, length, {logged, work, token}}.
return {redis.call('LRANGE', KEYS[1], ARGV[1], ARGV[2]), redis.call('LLEN', KEYS[1]),
  redis.call('HMGET', KEYS[2], 'logged', 'work', 'token')}
