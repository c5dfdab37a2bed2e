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
  local prev
  local all = redis.call('HGETALL', reg)
  for j = 1, #all, 2 do
    if all[j + 1] == 'previous' then
      prev = all[j]
    end
  end
  if not cur or not prev or prev == cur then
    return {NO_PREVIOUS, i}
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
