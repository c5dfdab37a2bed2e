-- release.lua: compare-and-delete. Deletes each lock key that still holds
-- our token and leaves any other holder's lock alone (C8).
--
-- KEYS[1..]  lock keys
-- ARGV[1]    lock token
--
-- Returns the number of locks deleted.
local deleted = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    deleted = deleted + redis.call('DEL', KEYS[i])
  end
end
return deleted
