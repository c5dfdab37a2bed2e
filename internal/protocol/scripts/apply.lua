-- apply.lua: apply one change (its ops) to the live keys, and log it for
-- the run in progress on those keys, if any, in one atomic step.
--
-- Everything that could fail is checked before the first write, so that a
-- change is applied whole or not at all: the rights of this user on every
-- key (redis.acl_check_cmd, where the server has it), the type of every key
-- an op writes, and the runs that hold the locks.
--
-- While a lock is held, a change to its keys is logged or refused, never
-- applied silently: a run that does not replay it would publish over it.
-- It is logged when the lock's record carries the lock's token, the mode
-- "rebuild" and the version this script knows (a Rebuilder's run, which
-- replays its log onto its temp keys before it publishes), and each op's
-- key is one of that run's. Any other holder, a lock without a record
-- (store.WithRebuild, a Familia rebuild, a record lost), a record with
-- another token (forged, or lost and re-created), a rollback, or a run of a
-- version this script does not know, refuses the whole change.
--
-- A logged change is counted where it is appended, in the same step: the
-- record's "logged" counts the entries of the lock's log, and "work" their
-- ops and arguments. The run compares them with the log, so that a log
-- lost on its own (evicted, deleted, rolled back) fails it closed. The log
-- gets the lock's remaining TTL when this script creates it, and the
-- heartbeat renews it with the lock; the run's release deletes it.
--
-- KEYS[1..n]        lock keys
-- KEYS[n+1..2n]     their records
-- KEYS[2n+1..3n]    their logs
-- KEYS[3n+1..]      the live keys the ops write, then the n indexes'
--                   pointers (keys.PointerKey), then s owner stamps
--                   (keys.OwnerKey, SPEC C104), last
-- ARGV[1]           n
-- ARGV[2]           the most entries a log may hold; a log that reaches it
--                   gets the entry "!overrun", and nothing more
-- ARGV[3]           the number of ops
-- ARGV[4]           s: the stamps of the bases another index can share
--                   (on a cluster, X and "{X}"), whose pointer may be the
--                   other index's
-- ARGV[5..4+s]      the index (1..n) whose base each stamp is
-- ARGV[5+s..4+2s]   the live key (or family prefix) of that index
-- ARGV[5+2s..4+3s]  the other live key of that base (keys.Alias)
-- ARGV[5+3s..]      per op: its lock's index (1..n), its key's index in
--                   KEYS after 3n, the command, the count of args, the args
--
-- Returns {OK, l1..ln}: applied; li = LOGGED the change was logged for the
--           run holding lock i, LOG_NONE no run holds it (or no op of the
--           change is its), LOG_FULL its log is full (the run will fail).
--         {NO_RIGHT, cmd, key}: this user may not run cmd on key; nothing written.
--         {UNKNOWN_CMD, cmd}: cmd does not exist (renamed or disabled).
--         {WRONG_TYPE, key, type}: key holds a type the op cannot write.
--         {UNLOGGED, i, why, detail}: lock i is held by a run that does not log
--           this change: why is 'none' (no record with a token), 'token'
--           (the record's token is not the lock's), 'mode' (detail: the
--           record's mode), 'version' (detail: the record's version) or
--           'keys' (the record names no key); nothing written.
--         {NOT_THE_RUNS, i, key, owner}: key is not one of the keys of the run
--           holding lock i, which rebuilds owner; nothing written.
--         {IN_GROUP, i, group}: index i's pointer holds 'group:<group>', a
--           group's claim (claim.lua, SPEC C102): the index's data is the
--           group's generations, and the live keys nobody reads; nothing
--           written. Not when index i's stamp names another live key: the
--           pointer is that index's, and so is its claim.
--         {OWNED, j, kind, ''}: stamp j is of another type than a string
--           (lib/owner.lua); nothing written.
--         {OWNED, j, 'string', value}: stamp j names neither key of its
--           base (written by hand); nothing written.
-- #include keys
-- #include remove
-- #include changes
-- #include owner
local n, bound, count = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local s = tonumber(ARGV[4])
local stampOf = {}
for j = 1, s do
  stampOf[tonumber(ARGV[4 + j])] = j
end
for i = 1, n do
  -- A stamp naming the other live key of the base: the shared pointer is
  -- that index's, whatever it holds, and this index rebuilds in place. A
  -- stamp naming neither key refuses the change, as it refuses a run.
  local j, theirs = stampOf[i], false
  if j then
    local stamp = KEYS[#KEYS - s + j]
    local r = changes.refused('TYPE', stamp) or changes.refused('GET', stamp)
    if r then return r end
    r = owner.refused(j, stamp, ARGV[4 + s + j])
    if r and (r[3] ~= 'string' or r[4] ~= ARGV[4 + 2 * s + j]) then return r end
    theirs = r ~= nil
  end
  -- pcall: a pointer of another type holds no claim.
  local p = not theirs and redis.pcall('GET', KEYS[#KEYS - s - n + i])
  if type(p) == 'string' and string.sub(p, 1, 6) == 'group:' then
    return {IN_GROUP, i, string.sub(p, 7)}
  end
end
local ops, perLock = changes.parse(count, 5 + 3 * s, function(at)
  local key = KEYS[3 * n + tonumber(ARGV[at + 1])]
  return tonumber(ARGV[at]), key, key, at + 2
end)

for i = 1, n do
  local r = changes.canLog(KEYS[i], KEYS[n + i], KEYS[2 * n + i])
  if r then return r end
end
local r = changes.unfit(ops)
if r then return r end
-- The runs holding the locks: logged, or refused.
local logging
logging, r = changes.loggingEach(n, perLock)
if r then return r end
changes.runAll(ops)
return changes.logEach(n, logging, perLock, bound)
