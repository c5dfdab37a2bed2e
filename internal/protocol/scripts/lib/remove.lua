-- lib/remove.lua: the conditional removals of a change, HDELIF and ZREMIF,
-- which are not Redis commands but ops of keyswap's own: a Hash's field is
-- removed only while it holds the old item's value, and a SortedSet's
-- member only while it has the old item's score, so that a removal never
-- takes an entry another item has taken meanwhile.
--
-- HDELIF key field value [field value ...]
-- ZREMIF key score member [score member ...]
local remove = {}

-- number returns a score as a number: what ZSCORE replies, or what the Go
-- side writes (+Inf, -Inf, or a decimal number).
local function number(s)
  local l = string.lower(s)
  if l == 'inf' or l == '+inf' then return math.huge end
  if l == '-inf' then return -math.huge end
  return tonumber(s)
end

-- run runs one conditional op, cmd ('HDELIF' or 'ZREMIF') on key with its
-- args, and returns the entries removed.
function remove.run(cmd, key, args)
  local n = 0
  for j = 1, #args, 2 do
    if cmd == 'HDELIF' then
      if redis.call('HGET', key, args[j]) == args[j + 1] then
        n = n + redis.call('HDEL', key, args[j])
      end
    else
      local s = redis.call('ZSCORE', key, args[j + 1])
      if s and number(s) == number(args[j]) then
        n = n + redis.call('ZREM', key, args[j + 1])
      end
    end
  end
  return n
end
