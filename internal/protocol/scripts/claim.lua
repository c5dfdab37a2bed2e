-- claim.lua: claims an index for a group, in the slot of the index's own
-- (ungrouped) control keys, before a run in the group allocates a
-- generation of it (SPEC C102).
--
-- The data keys of a generation keep the index's name whatever its group,
-- and each registry numbers generations from 1: a run without the group,
-- or in another group, would write into (and, failing, remove) the
-- group's current generation. The claim is the fence: it leaves
-- 'group:<name>' in the pointer of the index without a group, which every
-- reader and run without the group reads first, and genalloc refuses an
-- allocation while the pointer holds it. Both run in this slot, so one of
-- the two is first: an allocation after the claim is refused, and a claim
-- after an allocation finds its registry field.
--
-- KEYS[1] the index's pointer without a group (keys.PointerKey)
-- KEYS[2] its registry without a group (keys.RegistryKey)
-- ARGV[1] the marker: 'group:' .. the group
-- ARGV[2] '1' to check only: the checks, then {OK, 0} where the claim
--         would set the marker, without setting it
--
-- Returns {OK, 1}: the pointer holds the marker (set before).
--         {OK, 0}: the pointer did not, and holds it now (or, checking
--           only, would).
--         {IN_GROUP, 1, group}: the pointer names another group; nothing written.
--         {UNGROUPED, key, what}: generations of runs without a group
--           exist (a pointer, or a field of the registry other than next),
--           or the keys hold what no run writes: key (the pointer or the
--           registry) is or holds what; nothing written.
local ptrKey, reg, marker = KEYS[1], KEYS[2], ARGV[1]
local kind = redis.call('TYPE', ptrKey)['ok']
if kind ~= 'string' and kind ~= 'none' then
  return {UNGROUPED, ptrKey, 'is a ' .. kind}
end
local ptr = redis.call('GET', ptrKey)
if ptr == marker then
  return {OK, 1}
end
if ptr then
  if string.sub(ptr, 1, 6) == 'group:' then
    return {IN_GROUP, 1, string.sub(ptr, 7)}
  end
  return {UNGROUPED, ptrKey, 'holds ' .. string.format('%q', string.sub(ptr, 1, 40))}
end
kind = redis.call('TYPE', reg)['ok']
if kind ~= 'hash' and kind ~= 'none' then
  return {UNGROUPED, reg, 'is a ' .. kind}
end
if kind == 'hash' then
  for _, f in ipairs(redis.call('HKEYS', reg)) do
    if f ~= 'next' then
      return {UNGROUPED, reg, 'holds generation ' .. string.format('%q', string.sub(f, 1, 40)) .. ' (' .. string.format('%q', string.sub(redis.call('HGET', reg, f) or '', 1, 40)) .. ')'}
    end
  end
end
if ARGV[2] ~= '1' then
  redis.call('SET', ptrKey, marker)
end
return {OK, 0}
