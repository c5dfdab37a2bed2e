-- publish.lua: the fenced atomic swap of one or more rebuilt keys.
--
-- One script, so the lock-ownership check, the temp-key presence check and
-- the RENAME (or the empty-rebuild delete) cannot be interleaved with another
-- client's commands. A separate "check the lock, then RENAME" sequence would
-- let a rebuild whose lock expired between the two steps publish its stale
-- snapshot over a successor's newer index.
--
-- The old value is UNLINKed before the RENAME: RENAME frees the value it
-- replaces synchronously, which blocks the server in proportion to its size
-- (about 350 ms for a 1M-field hash); UNLINK frees it in a background thread.
-- Readers cannot see the gap between the two: the script is atomic.
--
-- RENAME carries the temp key's TTL over, so PERSIST clears it: a live key
-- never inherits an expiry.
--
-- KEYS[1..L]           lock keys (L = ARGV[2]; 0 for an unfenced swap)
-- KEYS[L+1..L+T]       temp keys (T = ARGV[3])
-- KEYS[L+T+1..L+2T]    live keys, in the same order as the temp keys
-- KEYS[L+2T+1..]       orphans: live keys to UNLINK, e.g. SetIndex buckets
--                      this run did not produce
-- KEYS[#KEYS]          with ARGV[5]: the receipt key
-- ARGV[1]              lock token; '' skips the ownership check
-- ARGV[2]              L
-- ARGV[3]              T
-- ARGV[4]              T characters: '1' where the caller saw temp key i
--                      populated, so a missing key is a loss and must fail
--                      closed; '0' where a missing key is an empty rebuild
-- ARGV[5]              optional, fenced only: the receipt's TTL in seconds.
--                      The script then sets the last key to the token, in
--                      the same atomic step as the publish, so that a caller
--                      whose reply was lost can tell whether it ran.
--
-- Returns {-1, i}: lock i does not hold the token; nothing changed.
--         {0, i}:  temp key i was populated but is gone; nothing changed.
--         {1, o1, ..., oT}: published; oi = 1 renamed, 2 live key deleted
--                  (empty rebuild).
local token = ARGV[1]
local l = tonumber(ARGV[2])
local t = tonumber(ARGV[3])
local populated = ARGV[4]
local receipt = nil
if ARGV[5] and token ~= '' then
  receipt = KEYS[#KEYS]
end

if token ~= '' then
  for i = 1, l do
    if redis.call('GET', KEYS[i]) ~= token then
      return {-1, i}
    end
  end
end

local present = {}
for i = 1, t do
  present[i] = redis.call('EXISTS', KEYS[l + i]) == 1
  if not present[i] and string.sub(populated, i, i) == '1' then
    return {0, i}
  end
end

local out = {1}
for i = 1, t do
  local temp, final = KEYS[l + i], KEYS[l + t + i]
  redis.call('UNLINK', final)
  if present[i] then
    redis.call('RENAME', temp, final)
    redis.call('PERSIST', final)
    out[#out + 1] = 1
  else
    out[#out + 1] = 2
  end
end
local last = #KEYS
if receipt then
  last = last - 1
end
for i = l + 2 * t + 1, last do
  redis.call('UNLINK', KEYS[i])
end
if receipt then
  redis.call('SET', receipt, token, 'EX', ARGV[5])
end
return out
