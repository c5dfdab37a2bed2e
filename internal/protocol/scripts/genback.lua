-- genback.lua: the rollback of indexes published in Generations mode: a
-- flip of each index's pointer back to its previous generation, fenced by
-- the locks the rollback holds. O(number of indexes): no data key moves.
--
-- KEYS: L locks; then per index, three: its pointer, its registry, its
-- meta; all in the locks' slot.
-- ARGV[1] the token; ARGV[2] L; ARGV[3] N, the indexes; ARGV[4] the time,
-- in milliseconds since the epoch, for the metas.
--
-- For each index: the generation whose registry state is 'previous'
-- becomes current (the pointer names it), and the one current until now
-- becomes 'previous', so that a second rollback rolls forward again.
--
-- Returns {OK, g1..gN}: the generation now current of each index.
--         {LOCK_LOST, i}: lock i does not hold the token.
--         {NO_PREVIOUS, i}: index i has no pointer, or no previous
--                  generation.
--         {NOT_META, i}: the meta of index i is another key.
--         {BAD_REGISTRY, i, why}: index i's registry or pointer is in a
--           state no run leaves (two previous, a generation that is not
--           one, a pointer the registry does not mark current).
--         {IN_GROUP, i, group}: index i's pointer holds a group's claim
--           (claim.lua, SPEC C102): its generations are the group's.
-- On every reply but {OK, ...} nothing was written.
local token, L, N, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
for i = 1, L do
  if redis.call('GET', KEYS[i]) ~= token then
    return {LOCK_LOST, i}
  end
end
local flips = {}
for i = 1, N do
  local ptr, reg = KEYS[L + 3 * i - 2], KEYS[L + 3 * i - 1]
  local cur = redis.call('GET', ptr)
  if cur and string.sub(cur, 1, 6) == 'group:' then
    return {IN_GROUP, i, string.sub(cur, 7)}
  end
  local prev, previous = nil, 0
  local all = redis.call('HGETALL', reg)
  for j = 1, #all, 2 do
    if all[j + 1] == 'previous' then
      prev, previous = all[j], previous + 1
    end
  end
  if not cur or not prev or prev == cur then
    return {NO_PREVIOUS, i}
  end
  -- The registry and the pointer are input others may write: flip only
  -- between two generations (digits, no leading zero) that the registry
  -- marks as a run leaves them, one current (the pointer's) and one
  -- previous.
  local function generation(s)
    return string.match(s, '^[1-9]%d*$') and #s <= 15
  end
  if previous > 1 or not generation(prev) or not generation(cur) or redis.call('HGET', reg, cur) ~= 'current' then
    return {BAD_REGISTRY, i, 'the registry holds ' .. previous .. ' previous generations, previous ' .. string.format('%q', string.sub(prev, 1, 40)) .. ', and the pointer names ' .. string.format('%q', string.sub(cur, 1, 40)) .. ', which it must mark current'}
  end
  -- A meta of another type would fail its HINCRBY after the first flips.
  local kind = redis.call('TYPE', KEYS[L + 3 * i])['ok']
  if kind ~= 'none' and kind ~= 'hash' then
    return {NOT_META, i}
  end
  flips[i] = {cur, prev}
end
local out = {OK}
for i = 1, N do
  local ptr, reg, meta = KEYS[L + 3 * i - 2], KEYS[L + 3 * i - 1], KEYS[L + 3 * i]
  local cur, prev = flips[i][1], flips[i][2]
  redis.call('SET', ptr, prev)
  redis.call('HSET', reg, prev, 'current', cur, 'previous')
  local gen = redis.call('HINCRBY', meta, 'seq', 1)
  redis.call('HSET', meta, 'gen', gen, 'at', now)
  out[#out + 1] = tonumber(prev)
end
return out
