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
-- KEYS[3n+2..3n+1+o] o owner stamps of the locks' bases ("<base>:rebuild-owner"),
--                  o <= n: on a cluster, without a group, those of the
--                  live keys whose base another can have (keys.Aliasable);
--                  none elsewhere (in a group the claim stamps the index's
--                  own base)
-- ARGV[1]          token
-- ARGV[2]          ttl in seconds
-- ARGV[3]          n
-- ARGV[4]          m, the number of rights to check
-- ARGV[5]          'true' to set an absent stamp (a run in Generations
--                  mode), 'false' to check the stamps only
-- ARGV[6..5+o]     the live key (or family prefix) of each stamp's lock
-- ARGV[6+o..5+o+2m] m pairs: a command name and the key it will run on ('':
--                  a command without keys, such as MULTI; for EVAL, the key
--                  its script would be given)
-- ARGV[6+o+2m..]   per record, in order: the number of its fields, then
--                  its field/value pairs
--
-- The owner stamp (SPEC C104): on a cluster an untagged key X and the
-- tagged key {X} have one base, so one lock, pointer, registry and every
-- other key derived from it. The first run in Generations mode to take a
-- base's lock stamps it with its live key, in this step, without a TTL; a
-- run of another live key (in either mode) is refused before anything is
-- written, a stamp of another type too. A check only never writes one.
--
-- Returns {OK}: every lock taken, every record open.
--         {OWNED, i, kind, value}: stamp i (KEYS[3n+1+i]) is another
--           live key's (kind 'string', value its name) or of another
--           type (kind); nothing changed.
--         {HELD, i}: lock i is held (by another run); nothing changed.
--         {NO_RIGHT, cmd, key}: this user may not run cmd on key; nothing changed.
--         {UNKNOWN_CMD, cmd}: cmd does not exist (renamed or disabled); nothing changed.
local n = tonumber(ARGV[3])
local m = tonumber(ARGV[4])
local ctl = KEYS[3 * n + 1]
local o = #KEYS - 3 * n - 1
local write = ARGV[5] == 'true'
local pairs_at = 6 + o
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
  for i = 1, o do
    local stamp = KEYS[3 * n + 1 + i]
    r = refused('TYPE', stamp) or refused('GET', stamp) or (write and refused('SET', stamp))
    if r then return r end
  end
  for j = 0, m - 1 do
    r = refused(ARGV[pairs_at + 2 * j], ARGV[pairs_at + 1 + 2 * j])
    if r then return r end
  end
end
-- The stamps before the locks: a base another live key owns is refused
-- as such, even while that key's run holds the lock.
local unstamped = {}
for i = 1, o do
  local stamp = KEYS[3 * n + 1 + i]
  local kind = redis.call('TYPE', stamp)['ok']
  if kind == 'none' then
    if write then unstamped[#unstamped + 1] = i end
  elseif kind ~= 'string' then
    return {OWNED, i, kind, ''}
  else
    local owner = redis.call('GET', stamp)
    if owner ~= ARGV[5 + i] then
      return {OWNED, i, 'string', owner}
    end
  end
end
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    return {HELD, i}
  end
end
for _, i in ipairs(unstamped) do
  redis.call('SET', KEYS[3 * n + 1 + i], ARGV[5 + i])
end
redis.call('DEL', ctl)
local at = pairs_at + 2 * m
for i = 1, n do
  local c = tonumber(ARGV[at])
  redis.call('SET', KEYS[i], ARGV[1], 'EX', ARGV[2])
  redis.call('DEL', KEYS[n + i], KEYS[2 * n + i])
  redis.call('HSET', KEYS[n + i], unpack(ARGV, at + 1, at + 2 * c))
  redis.call('EXPIRE', KEYS[n + i], ARGV[2])
  at = at + 1 + 2 * c
end
return {OK}
