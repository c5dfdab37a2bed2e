-- genlog.lua: the first step of a change applied to indexes published in
-- Generations mode whose keys are not all in the locks' slot (on a
-- cluster, a family without a hash tag, whose buckets spread over every
-- slot, or an index whose generation keys leave its lock's slot). It runs
-- in the locks' slot and writes no data: it resolves each index's pointer,
-- checks it, checks this user's rights on every key the change will write
-- in that generation, and logs the change for the run holding a lock, if
-- any, exactly as apply.lua and genapply.lua do (lib/changes.lua). The
-- caller then writes the ops on the generation's keys, one script
-- (genwrite.lua) per slot, and checks with genkept.lua that the
-- generation is still one the registry keeps, else removes what it wrote
-- there with UNLINK: this script checks the rights of those too.
--
-- A pointer must be a generation (canonical decimal) that the registry
-- marks current: anything else is a state no run leaves, and the change is
-- refused before any write. An index without a pointer (the
-- rename-in-place shape) resolves to '0': its plain keys.
--
-- KEYS[1..n]        lock keys
-- KEYS[n+1..2n]     their records
-- KEYS[2n+1..3n]    their logs
-- KEYS[3n+1..4n]    the indexes' pointers
-- KEYS[4n+1..5n]    the indexes' registries
-- KEYS[5n+1..6n]    the locks' cut-over marks (keys.CutOverKey)
-- KEYS[6n+1..6n+s]  s owner stamps (keys.OwnerKey, SPEC C104): of the
--                   indexes whose base another live key can have (on a
--                   cluster, without a group); each must be absent or
--                   name its index, else nothing is written or logged
-- ARGV[1]           n
-- ARGV[2]           the most entries a log may hold (see apply.lua)
-- ARGV[3]           the number of ops
-- ARGV[4]           s
-- ARGV[5..4+s]      the live key (or family prefix) each stamp must name
-- ARGV[5+s..]       per op: its lock's index (1..n), its live key, the
--                   head and the tail of its key in a generation (the key
--                   of generation G is head .. G .. tail), the command, the
--                   count of args, the args
--
-- Returns {OK, l1..ln, g1..gn}: logged; li as apply.lua returns them, gi
--           the generation of index i the ops are to be written to ('0':
--           the plain keys).
--         {NO_RIGHT, cmd, key}, {UNKNOWN_CMD, cmd}: as apply.lua; nothing
--           written.
--         {UNLOGGED, i, why, detail}, {NOT_THE_RUNS, i, key, owner}: as
--           apply.lua; nothing written.
--         {WAIT, i, pttl}: as genapply.lua; nothing written or logged.
--         {BAD_REGISTRY, i, why}: pointer i is not a generation, or its
--           registry does not mark it current; nothing written.
--         {IN_GROUP, i, group}: pointer i holds a group's claim (SPEC
--           C102); nothing written.
--         {OWNED, j, kind, value}: stamp j names another live key, or is
--           of another type (lib/owner.lua); nothing written or logged.
-- #include keys
-- #include remove
-- #include changes
-- #include owner
local n, bound, count = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local s = tonumber(ARGV[4])

for i = 1, n do
  local r = changes.canLog(KEYS[i], KEYS[n + i], KEYS[2 * n + i], KEYS[5 * n + i])
    or changes.refused('GET', KEYS[3 * n + i]) or changes.refused('HGET', KEYS[4 * n + i], 'current')
    or changes.refused('TYPE', KEYS[3 * n + i]) or changes.refused('TYPE', KEYS[4 * n + i])
  if r then return r end
end
-- The owner stamps before the pointers: a pointer of a base another
-- index owns is that index's, and so is its generation.
for j = 1, s do
  local r = changes.refused('TYPE', KEYS[6 * n + j]) or changes.refused('GET', KEYS[6 * n + j])
    or owner.refused(j, KEYS[6 * n + j], ARGV[4 + j])
  if r then return r end
end
local gens = {}
for i = 1, n do
  local g = redis.call('GET', KEYS[3 * n + i])
  if not g then
    gens[i] = '0'
  elseif string.sub(g, 1, 6) == 'group:' then
    return {IN_GROUP, i, string.sub(g, 7)}
  elseif not string.match(g, '^[1-9]%d*$') or #g > 15 then
    return {BAD_REGISTRY, i, 'the pointer holds ' .. string.format('%q', string.sub(g, 1, 40)) .. ', not a generation'}
  else
    local why = changes.notCurrent(KEYS[4 * n + i], g)
    if why then
      return {BAD_REGISTRY, i, why}
    end
    gens[i] = g
  end
end

local inGen = {} -- the keys of a generation (not plain keys)
local ops, perLock = changes.parse(count, 5 + s, function(at)
  local lock, live = tonumber(ARGV[at]), ARGV[at + 1]
  local key = live
  if gens[lock] ~= '0' then
    key = ARGV[at + 2] .. gens[lock] .. ARGV[at + 3]
    inGen[key] = true
  end
  return lock, key, live, at + 4
end)
-- The rights on the keys of the generation, wherever their slots: the
-- writes that follow in other slots are refused here, before anything is
-- logged; and UNLINK, with which the last step removes them from a
-- generation a flip retired meanwhile (genkept.lua checks with TYPE, GET
-- and HGET, checked above).
local r = changes.refusedAny(ops)
if r then return r end
for key in pairs(inGen) do
  r = changes.refused('UNLINK', key)
  if r then return r end
end
local logging
logging, r = changes.loggingEach(n, perLock, 5 * n)
if r then return r end
local out = changes.logEach(n, logging, perLock, bound)
for i = 1, n do
  out[#out + 1] = gens[i]
end
return out
