-- release.lua: compare-and-delete. Deletes each lock key that still holds
-- our token and leaves any other holder's lock alone (C8).
--
-- KEYS[1..n]  lock keys
-- KEYS[n+1]   with ARGV[2] = '1': the receipt a fenced publish leaves
-- ARGV[1]     lock token
-- ARGV[2]     optional: '1' when the last key is the receipt
--
-- Returns {deleted, foreign, receipt}: the number of locks deleted; the
-- number held by another token; and 1 when the receipt held our token (it
-- is deleted too), else 0. A lock that is absent counts in neither: it
-- expired, or this release already ran (rueidis retries the script when a
-- reply is lost), and either way nothing of ours is left to delete.
--
-- Releasing and reading the receipt in one step is what lets a caller
-- whose publish reply was lost settle its outcome: once this has run, no
-- publish fenced on these locks can happen any more, and the receipt says
-- whether one already did.
local n = #KEYS
local receipt = 0
if ARGV[2] == '1' then
  n = n - 1
  if redis.call('GET', KEYS[#KEYS]) == ARGV[1] then
    redis.call('DEL', KEYS[#KEYS])
    receipt = 1
  end
end
local deleted, foreign = 0, 0
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if v == ARGV[1] then
    deleted = deleted + redis.call('DEL', KEYS[i])
  elseif v then
    foreign = foreign + 1
  end
end
return {deleted, foreign, receipt}
