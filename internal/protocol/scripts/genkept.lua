-- genkept.lua: the last step of a change applied in Generations mode
-- across slots (see genlog.lua), in the locks' slot: whether each
-- generation the change was written to is still one that readers or a
-- rollback may read. It only reads.
--
-- A generation G is kept while the pointer names it or the registry marks
-- it current or previous. Any other state is final (retired, or its field
-- removed by the sweep): a flip moved the pointer between the first step
-- and the writes, and the sweep may already have scanned G, so the keys
-- the writes made there would never be removed; the caller removes them.
-- The plain keys ('0') are kept while the index has no pointer; the caller
-- does not remove them when it has one (Rebuilder.DropPlain does, however
-- late they were written).
--
-- Whether the pointer still names G is told apart: when it does not (a
-- flip, or a rollback that made an older generation current again), the
-- caller applies the change again to the generation the pointer names now.
-- A flip's new generation already has the change (replayed from the log,
-- or read from the source by a run that took the lock after the first
-- step); a rollback's does not: it was built before the change.
--
-- KEYS[1..n]      the indexes' pointers
-- KEYS[n+1..2n]   their registries
-- ARGV[1..n]      the generation the change was written to, per index
--
-- Returns {OK, k1..kn}: ki = 2 the pointer names G (for '0': there is no
-- pointer), 1 kept but the pointer names another generation, 0 not kept.
local n = #ARGV
local out = {OK}
for i = 1, n do
  -- A pointer or a registry of another type names no generation. A
  -- command this user may not run fails the script: nothing is then
  -- taken for not kept.
  local kind = redis.call('TYPE', KEYS[i])['ok']
  local ptr = kind == 'string' and redis.call('GET', KEYS[i]) or nil
  local k = 0
  if ARGV[i] == '0' then
    if kind == 'none' then k = 2 end
  elseif ptr == ARGV[i] then
    k = 2
  else
    local st = redis.call('TYPE', KEYS[n + i])['ok'] == 'hash' and redis.call('HGET', KEYS[n + i], ARGV[i])
    if st == 'current' or st == 'previous' then k = 1 end
  end
  out[#out + 1] = k
end
return out
