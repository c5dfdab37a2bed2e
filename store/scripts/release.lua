-- release.lua: compare-and-delete. Deletes each lock key that still holds
-- our token and leaves any other holder's lock alone (C8).
--
-- KEYS[1..]  lock keys
-- ARGV[1]    lock token
--
-- Returns {deleted, foreign}: the number of locks deleted, and the number
-- held by another token. A lock that is absent counts in neither: it
-- expired, or this release already ran (rueidis retries the script when a
-- reply is lost), and either way nothing of ours is left to delete.
local deleted, foreign = 0, 0
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v == ARGV[1] then
    deleted = deleted + redis.call('DEL', KEYS[i])
  elseif v then
    foreign = foreign + 1
  end
end
return {deleted, foreign}
