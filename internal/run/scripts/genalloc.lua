-- genalloc.lua: allocates a generation per index for a run in Generations
-- mode, fenced by the run's locks.
--
-- KEYS: L locks, then N registries (keys.RegistryKey), then the N
-- indexes' pointers (keys.PointerKey), in the locks' slot.
-- ARGV[1] the run's token; ARGV[2] L.
--
-- For each registry, HINCRBY next 1 allocates the generation G, and the
-- field G is set to 'building:<token>' (keys.RegBuilding): a generation a
-- run with that token builds. A sweep removes the keys of a generation so
-- marked whose lock no longer holds the token (the run died).
--
-- Returns {OK, g1..gN, c1..cN}: the generations allocated, and the
--           current generation of each index (0: it has no pointer), which
--           stays current while the run holds the locks.
--         {LOCK_LOST, i}: lock i does not hold the token; nothing written.
local token, L = ARGV[1], tonumber(ARGV[2])
for i = 1, L do
  if redis.call('GET', KEYS[i]) ~= token then
    return {LOCK_LOST, i}
  end
end
local N = (#KEYS - L) / 2
-- The pointers first: one of another type fails the script before any
-- write.
local current = {}
for i = 1, N do
  current[i] = tonumber(redis.call('GET', KEYS[L + N + i]) or '0') or 0
end
local out = {OK}
for i = L + 1, L + N do
  local g = redis.call('HINCRBY', KEYS[i], 'next', 1)
  redis.call('HSET', KEYS[i], tostring(g), 'building:' .. token)
  out[#out + 1] = g
end
for i = 1, N do
  out[#out + 1] = current[i]
end
return out
