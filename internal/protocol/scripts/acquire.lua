-- acquire.lua: take every lock of a run under one token, all or none, and
-- open the run's record next to each lock.
--
-- One script, so that two runs that want overlapping locks cannot both take
-- part of them: the first to run takes all, the other none. Before any
-- write it checks that this user may run every command the run will send
-- (redis.acl_check_cmd, Redis 7), so that a missing right fails the run
-- before anything is written, instead of halfway through its publish.
--
-- Each lock gets a record of its own, written only by the run (and, for the
-- counters of its log, by Apply), and the operator's requests of an earlier
-- run, next to the first lock, are deleted: requests are for one run.
--
-- KEYS[1..n]       lock keys
-- KEYS[n+1..2n]    their records ("<lock>:run")
-- KEYS[2n+1..3n]   their logs of changes ("<lock>:log")
-- KEYS[3n+1]       the operator's requests, next to the first lock ("<lock>:ctl")
-- ARGV[1]          token
-- ARGV[2]          ttl in seconds
-- ARGV[3]          n
-- ARGV[4]          m, the number of rights to check
-- ARGV[5..4+2m]    m pairs: a command name and the key it will run on ('':
--                  a command without keys, such as MULTI; for EVAL, the key
--                  its script would be given)
-- ARGV[5+2m..]     per record, in order: the number of its fields, then
--                  its field/value pairs
--
-- Returns {OK}: every lock taken, every record open.
--         {HELD, i}: lock i is held (by another run); nothing changed.
--         {NO_RIGHT, cmd, key}: this user may not run cmd on key; nothing changed.
--         {UNKNOWN_CMD, cmd}: cmd does not exist (renamed or disabled); nothing changed.
local n = tonumber(ARGV[3])
local m = tonumber(ARGV[4])
local ctl = KEYS[3 * n + 1]
if redis.acl_check_cmd then
  local function refused(cmd, key)
    local args = {cmd}
    if cmd == 'EVAL' or cmd == 'EVALSHA' then
      -- EVAL with its arguments, a script and a key or none: redis-server
      -- 7.0 reads EVAL's number of keys from them without checking they
      -- are there, and crashes, for a user with key patterns.
      args = {cmd, 'return 1', key == '' and '0' or '1'}
    end
    if key ~= '' then args[#args + 1] = key end
    local ok, allowed = pcall(redis.acl_check_cmd, unpack(args))
    if not ok then
      return {UNKNOWN_CMD, cmd}
    elseif not allowed then
      return {NO_RIGHT, cmd, key}
    end
  end
  -- This script's own commands first, then the run's.
  local r = refused('DEL', ctl)
  if r then return r end
  for i = 1, n do
    r = refused('EXISTS', KEYS[i]) or refused('SET', KEYS[i])
      or refused('DEL', KEYS[n + i]) or refused('DEL', KEYS[2 * n + i])
      or refused('HSET', KEYS[n + i]) or refused('EXPIRE', KEYS[n + i])
    if r then return r end
  end
  for j = 0, m - 1 do
    r = refused(ARGV[5 + 2 * j], ARGV[6 + 2 * j])
    if r then return r end
  end
end
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    return {HELD, i}
  end
end
redis.call('DEL', ctl)
local at = 5 + 2 * m
for i = 1, n do
  local c = tonumber(ARGV[at])
  redis.call('SET', KEYS[i], ARGV[1], 'EX', ARGV[2])
  redis.call('DEL', KEYS[n + i], KEYS[2 * n + i])
  redis.call('HSET', KEYS[n + i], unpack(ARGV, at + 1, at + 2 * c))
  redis.call('EXPIRE', KEYS[n + i], ARGV[2])
  at = at + 1 + 2 * c
end
return {OK}
