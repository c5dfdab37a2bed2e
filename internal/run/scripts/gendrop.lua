-- gendrop.lua: removes a generation's field from its index's registry once
-- its data keys are gone, unless its state changed meanwhile.
--
-- KEYS[1] the registry (keys.RegistryKey).
-- ARGV[1] the generation; ARGV[2] the state it must still have: exact, or,
-- with ARGV[3] = '1', a prefix of it (keys.RegRetired, whatever the time).
--
-- Returns {OK, 1}: the field was removed; {OK, 0}: it is gone already, or
-- holds another state (a rollback made it current again): left alone.
local state = redis.call('HGET', KEYS[1], ARGV[1])
if not state then
  return {OK, 0}
end
local match = state == ARGV[2]
if ARGV[3] == '1' then
  match = string.sub(state, 1, #ARGV[2]) == ARGV[2]
end
if not match then
  return {OK, 0}
end
redis.call('HDEL', KEYS[1], ARGV[1])
return {OK, 1}
