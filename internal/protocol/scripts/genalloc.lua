-- genalloc.lua: allocates a generation per index for a run in Generations
-- mode, fenced by the run's locks.
--
-- KEYS: L locks, then N registries (keys.RegistryKey), then the N
-- indexes' pointers (keys.PointerKey), in the locks' slot.
-- ARGV[1] the run's token; ARGV[2] L; ARGV[2 + i] the floor of index i
-- (digits): for a run in a group, the floor its claim returned (claim.lua,
-- SPEC C102): the generation it reserved in the index's registry without
-- a group, less one. ARGV[3 + N] the mode: 'peek' checks and returns the
-- generations it would allocate, writing nothing (a run in a group reads
-- them before its claim reserves them); 'exact' refuses, before any
-- write, a generation other than one past its floor (the one reserved);
-- absent or '' allocates above the floors.
--
-- For each registry, the generation G is allocated (field next set to it),
-- and the field G is set to 'building:<token>' (keys.RegBuilding): a generation a
-- run with that token builds. A sweep removes the keys of a generation so
-- marked whose lock no longer holds the token (the run died).
--
-- The registry and the pointer are input that others may write, and a
-- generation handed out twice would have a run write into the data readers
-- read. So before any write, per index: the registry is a hash (or absent),
-- the pointer absent or a generation (digits, no leading zero) that the
-- registry marks current, `next` absent or digits, and the generation to
-- hand out, one past the largest of `next`, the pointer's and the floor,
-- not in the registry yet. Any other state is refused: a registry evicted or deleted
-- while its pointer stayed, a `next` set back, a field left over.
--
-- Returns {OK, g1..gN, c1..cN}: the generations allocated, and the
--           current generation of each index (0: it has no pointer), which
--           stays current while the run holds the locks.
--         {LOCK_LOST, i}: lock i does not hold the token; nothing written.
--         {BAD_REGISTRY, i, why}: index i's registry or pointer is in a
--           state no run leaves; nothing written.
--         {MOVED_PAST, i, why}: in mode 'exact', index i's next or pointer
--           moved past the generation reserved, which no run does while
--           this one holds the locks; nothing written.
--         {IN_GROUP, i, group}: index i's pointer holds 'group:<group>', a
--           run in that group's claim (claim.lua, SPEC C102): the group's
--           generations have the names this run's would; nothing written.
local token, L = ARGV[1], tonumber(ARGV[2])
for i = 1, L do
  if redis.call('GET', KEYS[i]) ~= token then
    return {LOCK_LOST, i}
  end
end
local N = (#KEYS - L) / 2
local mode = ARGV[3 + N] or ''
local function generation(s)
  return s and string.match(s, '^[1-9]%d*$') and #s <= 15
end
local current, gens = {}, {}
for i = 1, N do
  local reg, ptrKey = KEYS[L + i], KEYS[L + N + i]
  local kind = redis.call('TYPE', reg)['ok']
  if kind ~= 'hash' and kind ~= 'none' then
    return {BAD_REGISTRY, i, 'the registry is a ' .. kind}
  end
  -- A pointer of another type fails the script here, before any write.
  local ptr = redis.call('GET', ptrKey)
  local cur = 0
  if ptr then
    if string.sub(ptr, 1, 6) == 'group:' then
      return {IN_GROUP, i, string.sub(ptr, 7)}
    end
    if not generation(ptr) then
      return {BAD_REGISTRY, i, 'the pointer holds ' .. string.format('%q', string.sub(ptr, 1, 40))}
    end
    if redis.call('HGET', reg, ptr) ~= 'current' then
      return {BAD_REGISTRY, i, 'the registry does not mark the pointer\'s generation ' .. ptr .. ' current'}
    end
    cur = tonumber(ptr)
  end
  local nx = redis.call('HGET', reg, 'next')
  local n = 0
  if nx then
    if not (nx == '0' or generation(nx)) then
      return {BAD_REGISTRY, i, 'its field next holds ' .. string.format('%q', string.sub(nx, 1, 40))}
    end
    n = tonumber(nx)
  end
  local floor = tonumber(ARGV[2 + i] or '0')
  local g = string.format('%d', math.max(n, cur, floor) + 1)
  if mode == 'exact' and tonumber(g) ~= floor + 1 then
    return {MOVED_PAST, i, 'its next or pointer moved to ' .. string.format('%d', tonumber(g) - 1) .. ', past generation ' .. string.format('%d', floor + 1) .. ' the run reserved, while the run held the lock'}
  end
  if redis.call('HEXISTS', reg, g) == 1 then
    return {BAD_REGISTRY, i, 'generation ' .. g .. ', the next one, is in the registry already'}
  end
  current[i], gens[i] = cur, g
end
local out = {OK}
for i = 1, N do
  if mode ~= 'peek' then
    redis.call('HSET', KEYS[L + i], 'next', gens[i], gens[i], 'building:' .. token)
  end
  out[#out + 1] = tonumber(gens[i])
end
for i = 1, N do
  out[#out + 1] = current[i]
end
return out
