-- lib/keys.lua: the shapes of keyswap's own keys, as package keys
-- (internal/keys) knows them, for the scripts that must tell a key of a run
-- from the keys keyswap keeps next to it. A test checks that both agree on
-- a table of shapes.
local keyshapes = {}

-- The suffixes of the keys keyswap keeps next to a live key: a lock, its
-- receipt, record, log, requests and cut-over mark, a meta and a kept previous value.
keyshapes.suffixes = {':rebuild-lock', ':rebuild-gen', ':rebuild-prev', ':rebuild-lock:done',
  ':rebuild-lock:run', ':rebuild-lock:log', ':rebuild-lock:ctl', ':rebuild-lock:cut'}

-- stamp reports whether s ends with ":rebuild:" and one or more digits.
local function stamp(s)
  local digits = string.match(s, '%d+$')
  if not digits then return false end
  local before = string.sub(s, 1, #s - #digits)
  return #before >= 9 and string.sub(before, -9) == ':rebuild:'
end

-- temp reports whether key is a temp key: "<base>:rebuild:<digits>", with
-- or without ":" and 16 hex digits after it (keys.ParseTempKey).
function keyshapes.temp(key)
  local n = #key
  if n > 16 and string.sub(key, n - 16, n - 16) == ':' and string.find(string.sub(key, n - 15), '^%x+$') then
    if stamp(string.sub(key, 1, n - 17)) then return true end
  end
  return stamp(key)
end

-- reserved reports whether key has the shape of a key keyswap keeps next to
-- a live key (keys.Reserved).
function keyshapes.reserved(key)
  -- Every reserved shape holds ":rebuild": most keys are told apart by one
  -- plain search (Apply checks every op's key).
  if not string.find(key, ':rebuild', 1, true) then return false end
  if keyshapes.temp(key) then return true end
  for _, s in ipairs(keyshapes.suffixes) do
    if #key >= #s and string.sub(key, -#s) == s then return true end
  end
  return false
end

-- owns reports whether key is one of a builder's keys: its key owner
-- itself, or, for a family, "<owner>:<bucket>" with a non-empty bucket that
-- is not of a reserved shape.
function keyshapes.owns(key, owner, family)
  if not family then return key == owner end
  return #key > #owner + 1 and string.sub(key, 1, #owner) == owner
    and string.sub(key, #owner + 1, #owner + 1) == ':' and not keyshapes.reserved(key)
end

-- first returns the first key of a list of keys as the record keeps them
-- (run.EncodeKeys: netstrings "<len>:<bytes>"), or nil.
function keyshapes.first(list)
  if not list then return nil end
  local colon = string.find(list, ':', 1, true)
  if not colon then return nil end
  local len = string.sub(list, 1, colon - 1)
  if not (len == '0' or string.match(len, '^[1-9]%d*$')) then return nil end
  local n = tonumber(len)
  if colon + n > #list then return nil end
  return string.sub(list, colon + 1, colon + n)
end

-- gen returns the key that holds key, one of the keys of the builder owner
-- (a family's prefix when family), in generation g: keys.GenKey,
-- keys.GenBucketKey.
function keyshapes.gen(key, owner, family, g)
  if family then
    return owner .. ':rebuild-g:' .. g .. string.sub(key, #owner + 1)
  end
  return key .. ':rebuild-g:' .. g
end
