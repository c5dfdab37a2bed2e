-- release.lua: compare-and-delete. Deletes each lock key that still holds
-- our token, with the record and the log of changes kept next to it (and
-- the operator's requests, next to the first lock); our record next to a
-- lock someone else took; and the record, log and requests next to a lock
-- no one holds. It leaves any other holder's lock, record, log and
-- requests alone.
--
-- KEYS[1..n]       lock keys
-- KEYS[n+1..2n]    their records
-- KEYS[2n+1..3n]   their logs of changes
-- KEYS[3n+1]       the operator's requests, next to the first lock
-- KEYS[3n+2]       the receipt a fenced publish leaves
-- ARGV[1]          token
-- ARGV[2]          n
-- ARGV[3]          '1' when settling a publish whose reply was lost: the
--                  receipt is marked as read instead of deleted, so that a
--                  release retried after its own reply was lost still finds
--                  it (it expires by itself within seconds)
--
-- Returns {deleted, foreign, receipt}: the number of locks deleted; the
-- number held by another token; and 1 when the receipt holds our token (or
-- our token marked as read), else 0. A lock that is absent counts in
-- neither: it expired, or this release already ran (rueidis retries the
-- script when a reply is lost), and either way nothing of ours is left.
--
-- Releasing and reading the receipt in one step is what lets a caller
-- whose publish reply was lost settle its outcome: once this has run, no
-- publish fenced on these locks can happen any more, and the receipt says
-- whether one already did.
local token, n = ARGV[1], tonumber(ARGV[2])
local ctl, rcp = KEYS[3 * n + 1], KEYS[3 * n + 2]
local v = redis.call('GET', rcp)
local receipt = 0
if v == token or v == 'read:' .. token then
  receipt = 1
  if ARGV[3] == '1' then
    redis.call('SET', rcp, 'read:' .. token, 'KEEPTTL')
  else
    redis.call('DEL', rcp)
  end
end
local deleted, foreign = 0, 0
for i = 1, n do
  local lock, record, log = KEYS[i], KEYS[n + i], KEYS[2 * n + i]
  local holder = redis.call('GET', lock)
  if holder == token then
    deleted = deleted + redis.call('DEL', lock)
    redis.call('DEL', record, log)
    if i == 1 then redis.call('DEL', ctl) end
  elseif holder then
    -- A successor's acquire replaces the record, so a record with our
    -- token is ours; the log is the holder's.
    foreign = foreign + 1
    if redis.call('HGET', record, 'token') == token then
      redis.call('DEL', record)
    end
  else
    -- No run holds the lock: a record or a log left next to it is what a
    -- lapsed run left (a batch in flight re-creates the record after its
    -- lease lapsed; changes are logged only while a lock is held).
    redis.call('DEL', record, log)
    if i == 1 then redis.call('DEL', ctl) end
  end
end
return {deleted, foreign, receipt}
