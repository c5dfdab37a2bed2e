-- genapply.lua: apply one change (its ops) to the current generation of
-- indexes published in Generations mode, and log it for the run in
-- progress on those indexes, if any, in one atomic step.
--
-- The caller resolved each index's pointer and wrote the ops on the keys
-- of that generation; the script checks, in the same atomic step as the
-- writes, that the pointers still name those generations (a flip in
-- between would leave the change in a generation readers no longer read).
-- While a lock is held, the change is logged for its run or refused, as
-- apply.lua does (lib/changes.lua, changes.logging and changes.log): the
-- log holds the ops on their live (logical) keys, which the run replays
-- onto the keys of the generation it builds; its flip refuses while a log
-- holds entries it did not replay. Everything is checked before the first
-- write.
--
-- KEYS[1..n]        lock keys
-- KEYS[n+1..2n]     their records
-- KEYS[2n+1..3n]    their logs
-- KEYS[3n+1..4n]    the indexes' pointers
-- KEYS[4n+1..5n]    their registries
-- KEYS[5n+1..6n]    the locks' cut-over marks (keys.CutOverKey)
-- KEYS[6n+1..7n]    the manifests of the generations of ARGV[4..3+n]
--                   (keys.ManifestKey)
-- KEYS[7n+1..7n+s]  s owner stamps (keys.OwnerKey, SPEC C104), as
--                   genlog.lua takes them
-- KEYS[7n+s+1..]    the keys the ops write
-- ARGV[1]           n
-- ARGV[2]           the most entries a log may hold (see apply.lua)
-- ARGV[3]           the number of ops
-- ARGV[4..3+n]      the generation the caller resolved for index i ('0':
--                   no pointer, the rename-in-place shape)
-- ARGV[4+n..3+2n]   '1' when index i is a family, whose generation's
--                   manifest lists the keys the change writes in it (in
--                   the same step as the writes), else '0'
-- ARGV[4+2n]        s
-- ARGV[5+2n..4+2n+s] the live key (or family prefix) each stamp must name
-- ARGV[5+2n+s..]    per op: its lock's index (1..n), its key's index in
--                   KEYS after 7n+s, its live key, the command, the count
--                   of args, the args
--
-- Returns {OK, l1..ln}: applied; li as apply.lua returns them.
--         {NO_RIGHT, cmd, key}, {UNKNOWN_CMD, cmd}: refused (an op, or the
--           SADD to a manifest); nothing written.
--         {WRONG_TYPE, key, type}: key holds a type the op cannot write.
--         {UNLOGGED, i, why, detail}, {NOT_THE_RUNS, i, key, owner}: lock i
--           is held by a run that does not log this change (see
--           apply.lua); nothing written.
--         {GEN_LOST, i}: pointer i names another generation now: resolve
--           it again.
--         {WAIT, i, pttl}: the run holding lock i is cutting over to its
--           flip (its mark, for pttl more ms at most): nothing written;
--           apply the change again once the mark is gone.
--         {BAD_REGISTRY, i, why}: registry i does not mark the generation
--           pointer i names current, a state no run leaves, or manifest i
--           is not a set; nothing written (genlog.lua checks the same).
--         {OWNED, j, kind, value}: stamp j names another live key, or is
--           of another type (lib/owner.lua); nothing written.
-- #include keys
-- #include remove
-- #include changes
-- #include owner
local n, bound, count = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local s = tonumber(ARGV[4 + 2 * n])
local listed = changes.manifests()
local ops, perLock = changes.parse(count, 5 + 2 * n + s, function(at)
  local i, key = tonumber(ARGV[at]), KEYS[7 * n + s + tonumber(ARGV[at + 1])]
  if ARGV[3 + n + i] == '1' and ARGV[3 + i] ~= '0' then
    listed.add(i, key)
  end
  return i, key, ARGV[at + 2], at + 3
end)

for i = 1, n do
  local r = changes.canLog(KEYS[i], KEYS[n + i], KEYS[2 * n + i], KEYS[5 * n + i]) or changes.refused('GET', KEYS[3 * n + i])
    or changes.refused('HGET', KEYS[4 * n + i], 'current')
  if r then return r end
end
-- The owner stamps first, as genlog.lua checks them.
for j = 1, s do
  local r = changes.refused('TYPE', KEYS[7 * n + j]) or changes.refused('GET', KEYS[7 * n + j])
    or owner.refused(j, KEYS[7 * n + j], ARGV[4 + 2 * n + j])
  if r then return r end
end
local r = changes.unfit(ops)
if r then return r end
local logging
logging, r = changes.loggingEach(n, perLock, 5 * n)
if r then return r end
for i = 1, n do
  if perLock[i] and (redis.call('GET', KEYS[3 * n + i]) or '0') ~= ARGV[3 + i] then
    return {GEN_LOST, i}
  end
  local why = ARGV[3 + i] ~= '0' and changes.notCurrent(KEYS[4 * n + i], ARGV[3 + i])
  if why then
    return {BAD_REGISTRY, i, why}
  end
  why, r = listed.unfit(i, KEYS[6 * n + i])
  if r then return r end
  if why then
    return {BAD_REGISTRY, i, why}
  end
end
changes.runAll(ops)
-- The removal of a generation whose manifest its run marked listed reads
-- the manifest rather than SCANning: every key written in it is listed.
for i = 1, n do
  listed.list(i, KEYS[6 * n + i])
end
return changes.logEach(n, logging, perLock, bound)
