-- genapply.lua: apply one change (its ops) to the current generation of
-- indexes published in Generations mode, while no run holds their locks.
--
-- The caller resolved each index's pointer and wrote the ops on the keys
-- of that generation; the script checks, in the same atomic step as the
-- writes, that the pointers still name those generations (a flip in
-- between would leave the change in a generation readers no longer read)
-- and that no run holds a lock (a run in progress would publish over the
-- change: logging it for a run is not supported in this mode yet).
-- Everything is checked before the first write.
--
-- KEYS[1..n]        lock keys
-- KEYS[n+1..2n]     the indexes' pointers
-- KEYS[2n+1..]      the keys the ops write
-- ARGV[1]           n
-- ARGV[2]           the number of ops
-- ARGV[3..2+n]      the generation the caller resolved for index i ('0':
--                   no pointer, the rename-in-place shape)
-- ARGV[3+n..]       per op: its lock's index (1..n), its key's index in
--                   KEYS after 2n, the command, the count of args, the args
--
-- Returns {OK}: applied.
--         {NO_RIGHT, cmd, key}, {UNKNOWN_CMD, cmd}: refused; nothing written.
--         {WRONG_TYPE, key, type}: key holds a type the op cannot write.
--         {UNLOGGED, i, 'generations', ''}: a run holds lock i.
--         {GEN_LOST, i}: pointer i names another generation now: resolve
--           it again.
-- #include keys
-- #include remove
-- #include changes
local n, count = tonumber(ARGV[1]), tonumber(ARGV[2])
local ops, used = {}, {}
local at = 3 + n
for _ = 1, count do
  local lock, key, cmd, nargs = tonumber(ARGV[at]), KEYS[2 * n + tonumber(ARGV[at + 1])], ARGV[at + 2], tonumber(ARGV[at + 3])
  ops[#ops + 1] = {cmd, key, {unpack(ARGV, at + 4, at + 3 + nargs)}}
  used[lock] = true
  at = at + 4 + nargs
end

for i = 1, n do
  local r = changes.refused('GET', KEYS[i]) or changes.refused('GET', KEYS[n + i])
  if r then return r end
end
local kinds = {}
for _, op in ipairs(ops) do
  local r = changes.check(op) or changes.refused('TYPE', op[2])
  if r then return r end
  r = changes.mistyped(op, kinds[op[2]] or redis.call('TYPE', op[2])['ok'])
  if r then return r end
  kinds[op[2]] = changes.types[op[1]]
end
for i = 1, n do
  if used[i] then
    if redis.call('GET', KEYS[i]) then
      return {UNLOGGED, i, 'generations', ''}
    end
    if (redis.call('GET', KEYS[n + i]) or '0') ~= ARGV[2 + i] then
      return {GEN_LOST, i}
    end
  end
end
for _, op in ipairs(ops) do
  changes.run(op)
end
return {OK}
