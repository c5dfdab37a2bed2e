-- claim.lua: claims an index for a group, in the slot of the index's own
-- (ungrouped) control keys, and reserves the generation the group's run
-- allocates of it there, before that run allocates it (SPEC C102).
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
-- The reservation is the second fence, for when the claim is gone
-- (deleted, evicted, lost in a failover): every run in the group, claimed
-- or claiming, raises the field next of the registry without a group to
-- the generation it is about to allocate, so that a run without the
-- group (or in another group, whose claim reads the same next) allocates
-- above every generation the group was ever given.
--
-- KEYS[1] the index's pointer without a group (keys.PointerKey)
-- KEYS[2] its registry without a group (keys.RegistryKey)
-- KEYS[3] the owner stamp of its base without a group (keys.OwnerKey,
--         SPEC C104), on a cluster when another live key can have that
--         base (keys.Aliasable); absent elsewhere: no stamp read or written
-- ARGV[1] the marker: 'group:' .. the group
-- ARGV[2] '1' to check only: the checks, then {OK, claimed, next} without
--         a write
-- ARGV[3] the group's floor (digits): the generation the group's
--         registry would allocate (genalloc.lua, mode 'peek') less one,
--         read under the run's locks, which keep it
-- ARGV[4] the index's live key (or family prefix), for the stamp, with
--         KEYS[3]
--
-- The stamp first: on a cluster the untagged X and the tagged {X} share
-- the base {X}, so X's claim and reservation would be {X}'s pointer and
-- registry. A base stamped with another live key, or a stamp of another
-- type, is refused before anything else; an absent stamp is set with the
-- claim (acquire.lua stamps the base of a run without a group).
--
-- Claiming, the floor is the larger of the field next of the registry
-- without a group ('0' when absent: the last generation a run without the
-- group allocated, or the group reserved) and ARGV[3]; next is set to
-- floor + 1, the generation the group's run allocates (genalloc.lua, mode
-- 'exact', hands out exactly floor + 1). A run without the group that
-- allocated before the claim, lost its lock, and had its field removed by
-- a sweep (the registry keeps only next) never shares the names of the
-- group's data keys, and neither does a later run without the claim. A
-- rerun (the script is retried) raises next once more: a number is
-- skipped, none shared.
--
-- Returns {OWNED, 1, kind, value}: the stamp is another live key's (kind
--           'string', value its name) or of type kind; nothing written.
--         {OK, 1, floor}: the pointer holds the marker (set before).
--         {OK, 0, floor}: the pointer did not, and holds it now (or,
--           checking only, would).
--         {BAD_REGISTRY, key, why}: the field next of the registry (key)
--           holds what no run writes (not digits): the floor is unknown;
--           nothing written.
--         {IN_GROUP, 1, group}: the pointer names another group; nothing written.
--         {UNGROUPED, key, what}: generations of runs without a group
--           exist (a pointer, or a field of the registry other than next),
--           or the keys hold what no run writes: key (the pointer or the
--           registry) is or holds what; nothing written.
local ptrKey, reg, marker, check = KEYS[1], KEYS[2], ARGV[1], ARGV[2] == '1'
local stamp, live = KEYS[3], ARGV[4]
local stampKind = 'string'
if stamp then
  stampKind = redis.call('TYPE', stamp)['ok']
end
if stampKind ~= 'string' and stampKind ~= 'none' then
  return {OWNED, 1, stampKind, ''}
elseif stamp and stampKind == 'string' then
  local owner = redis.call('GET', stamp)
  if owner ~= live then
    return {OWNED, 1, 'string', owner}
  end
end
local kind = redis.call('TYPE', ptrKey)['ok']
if kind ~= 'string' and kind ~= 'none' then
  return {UNGROUPED, ptrKey, 'is a ' .. kind}
end
local ptr = redis.call('GET', ptrKey)
local regKind = redis.call('TYPE', reg)['ok']
if regKind ~= 'hash' and regKind ~= 'none' then
  return {UNGROUPED, reg, 'is a ' .. regKind}
end
local next = '0'
if regKind == 'hash' then
  next = redis.call('HGET', reg, 'next') or '0'
  if not (next == '0' or (string.match(next, '^[1-9]%d*$') and #next <= 15)) then
    return {BAD_REGISTRY, reg, 'its field next holds ' .. string.format('%q', string.sub(next, 1, 40))}
  end
end
-- reserve raises next to the generation the group allocates, floor + 1,
-- and returns floor.
local function reserve()
  local floor = math.max(tonumber(next), tonumber(ARGV[3] or '0') or 0)
  redis.call('HSET', reg, 'next', string.format('%d', floor + 1))
  return string.format('%d', floor)
end
local was = 0
if ptr == marker then
  was = 1
elseif ptr then
  if string.sub(ptr, 1, 6) == 'group:' then
    return {IN_GROUP, 1, string.sub(ptr, 7)}
  end
  return {UNGROUPED, ptrKey, 'holds ' .. string.format('%q', string.sub(ptr, 1, 40))}
elseif regKind == 'hash' then
  for _, f in ipairs(redis.call('HKEYS', reg)) do
    if f ~= 'next' then
      return {UNGROUPED, reg, 'holds generation ' .. string.format('%q', string.sub(f, 1, 40)) .. ' (' .. string.format('%q', string.sub(redis.call('HGET', reg, f) or '', 1, 40)) .. ')'}
    end
  end
end
if check then
  return {OK, was, next}
end
-- The reservation first: a user who may not SET the pointer is refused
-- after a harmless raise of next, never with a claim and no reservation.
local floor = reserve()
if was == 0 then
  redis.call('SET', ptrKey, marker)
end
if stampKind == 'none' then
  redis.call('SET', stamp, live)
end
return {OK, was, floor}
