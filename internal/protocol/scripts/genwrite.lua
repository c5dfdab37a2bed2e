-- genwrite.lua: the second step of a change applied in Generations mode
-- across slots (see genlog.lua): the ops of the change on the keys of one
-- slot, in order, all or none of them: this user's rights and every key's
-- type are checked before the first write (lib/changes.lua).
--
-- KEYS[1..]   the keys the ops write, all in one slot
-- ARGV[1]     the number of ops
-- ARGV[2..]   per op: its key's index in KEYS, the command, the count of
--             args, the args
--
-- Returns {OK}: written.
--         {NO_RIGHT, cmd, key}, {UNKNOWN_CMD, cmd}, {WRONG_TYPE, key, type}:
--           as apply.lua; nothing written.
-- #include keys
-- #include remove
-- #include changes
local ops = changes.parse(tonumber(ARGV[1]), 2, function(at)
  local key = KEYS[tonumber(ARGV[at])]
  return 1, key, key, at + 1
end)
local r = changes.unfit(ops)
if r then return r end
changes.runAll(ops)
return {OK}
