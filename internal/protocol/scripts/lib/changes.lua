-- lib/changes.lua: the changes Apply writes to live keys, shared by the
-- apply, genapply, genlog, genwrite, publish and replay scripts (each
-- script that uses it starts with "-- #include changes", which the loader
-- replaces with this file, after "-- #include remove").
--
-- A change is a list of ops, each one command on one key: HSET, HDEL, ZADD,
-- ZREM, SADD or SREM, or a conditional removal, HDELIF or ZREMIF (see
-- lib/remove.lua). Every op sets or removes entries outright, or removes
-- them only while they hold what the op names, so the last op on an entry
-- decides it, whatever came before: replaying a log of ops onto a snapshot
-- gives the same entries as applying them live.
--
-- A log entry is the ops of one Apply for one lock, as netstrings: for
-- each op "<len>:<command>", "<len>:<key>", "<len>:<count>", then count
-- "<len>:<arg>". The entry "!overrun" marks a log that reached its bound:
-- later changes were not logged, and the run must fail.
local changes = {}

-- The type of key each command writes.
changes.types = {HSET = 'hash', HDEL = 'hash', HDELIF = 'hash', ZADD = 'zset', ZREM = 'zset', ZREMIF = 'zset',
  SADD = 'set', SREM = 'set'}

-- The ops whose args come in pairs, and whether the first of a pair is a
-- score.
local paired = {HSET = false, HDELIF = false, ZADD = true, ZREMIF = true}

changes.overrun = '!overrun'

-- encode returns ops as one log entry.
function changes.encode(ops)
  local parts = {}
  local function put(s)
    parts[#parts + 1] = #s .. ':' .. s
  end
  for _, op in ipairs(ops) do
    put(op[1])
    put(op[2])
    put(tostring(#op[3]))
    for _, a in ipairs(op[3]) do
      put(a)
    end
  end
  return table.concat(parts)
end

-- count returns s as a count, or nil: digits, without leading zeros.
local function count(s)
  if s and (s == '0' or string.match(s, '^[1-9]%d*$')) then
    return tonumber(s)
  end
end

-- score reports whether s is a score as the Go side writes it
-- (strconv.FormatFloat(v, 'g', -1, 64)) and ZADD takes it: +Inf, -Inf, or
-- a decimal number, with an exponent or not, that is finite and does not
-- round to zero unless it is zero.
function changes.score(s)
  if s == '+Inf' or s == '-Inf' then return true end
  local mant = string.match(s, '^(%-?%d+%.?%d*)e[-+]%d+$') or string.match(s, '^%-?%d+%.?%d*$')
  if not mant or string.sub(mant, -1) == '.' then return false end
  local v = tonumber(s)
  return v ~= nil and v > -math.huge and v < math.huge and (v ~= 0 or not string.find(mant, '[1-9]'))
end

-- decode returns the ops of a log entry, or nil and why it is not one as
-- encode writes it: every op with a change's command, a key, at least one
-- arg, pairs for HSET, HDELIF, ZADD and ZREMIF, and scores ZADD takes. It
-- refuses what the Go decoder (run.DecodeEntry) refuses, so that an entry
-- the publish would fail on after its renames is refused before any write.
function changes.decode(entry)
  local ops, pos = {}, 1
  local function take()
    local colon = string.find(entry, ':', pos, true)
    if not colon then return nil end
    local n = count(string.sub(entry, pos, colon - 1))
    if not n or colon + n > #entry then return nil end
    local s = string.sub(entry, colon + 1, colon + n)
    pos = colon + n + 1
    return s
  end
  while pos <= #entry do
    local cmd = take()
    local key = take()
    local n = count(take())
    if not (cmd and key and n) then return nil, 'it is not a change as keyswap encodes one' end
    if not changes.types[cmd] then return nil, 'its command ' .. cmd .. ' is not one a builder writes' end
    if key == '' then return nil, 'its ' .. cmd .. ' has an empty key' end
    if n < 1 or paired[cmd] ~= nil and n % 2 ~= 0 then
      return nil, 'its ' .. cmd .. ' has ' .. n .. ' arguments'
    end
    local args = {}
    for j = 1, n do
      args[j] = take()
      if not args[j] then return nil, 'it is not a change as keyswap encodes one' end
      if paired[cmd] and j % 2 == 1 and not changes.score(args[j]) then
        return nil, 'its ' .. cmd .. ' has the score ' .. args[j]
      end
    end
    ops[#ops + 1] = {cmd, key, args}
  end
  return ops
end

-- work returns the work of ops: an op and its arguments each count one.
function changes.work(ops)
  local w = 0
  for _, op in ipairs(ops) do
    w = w + 1 + #op[3]
  end
  return w
end

-- refused returns why this user may not run the command cmd on key
-- ({NO_RIGHT, cmd, key} or {UNKNOWN_CMD, cmd}), or nil. It checks nothing on servers
-- without redis.acl_check_cmd (before Redis 7).
function changes.refused(cmd, key, ...)
  if not redis.acl_check_cmd then return nil end
  local ok, allowed = pcall(redis.acl_check_cmd, cmd, key, ...)
  if not ok then
    return {UNKNOWN_CMD, cmd}
  elseif not allowed then
    return {NO_RIGHT, cmd, key}
  end
end

-- check returns why this user may not run op, or nil: for a conditional
-- removal, the commands it runs.
function changes.check(op)
  local cmd, key, args = op[1], op[2], op[3]
  if cmd == 'HDELIF' then
    return changes.refused('HGET', key, args[1]) or changes.refused('HDEL', key, args[1])
  elseif cmd == 'ZREMIF' then
    return changes.refused('ZSCORE', key, args[2]) or changes.refused('ZREM', key, args[2])
  end
  return changes.refused(cmd, key, unpack(args))
end

-- mistyped returns {WRONG_TYPE, key, kind} when op would fail on a key of type
-- kind ('none' for a missing key), or nil.
function changes.mistyped(op, kind)
  if kind ~= 'none' and kind ~= changes.types[op[1]] then
    return {WRONG_TYPE, op[2], kind}
  end
end

-- run applies op.
function changes.run(op)
  if op[1] == 'HDELIF' or op[1] == 'ZREMIF' then
    remove.run(op[1], op[2], op[3])
  else
    redis.call(op[1], op[2], unpack(op[3]))
  end
end

-- parse reads count ops from ARGV, from position at: each op is what head
-- reads at its position (head(at) returns the op's lock index, the key it
-- writes, its live key, and the position after them), then the command,
-- the count of args and the args. It returns the ops, in order, each
-- {cmd, key, args}, and per lock index the same ops on their live keys,
-- which are what a log holds. apply, genapply, genlog and genwrite read
-- their ops with it, each with its own head.
function changes.parse(count, at, head)
  local ops, perLock = {}, {}
  for _ = 1, count do
    local lock, key, live, nxt = head(at)
    local cmd, nargs = ARGV[nxt], tonumber(ARGV[nxt + 1])
    local args = {unpack(ARGV, nxt + 2, nxt + 1 + nargs)}
    ops[#ops + 1] = {cmd, key, args}
    perLock[lock] = perLock[lock] or {}
    table.insert(perLock[lock], {cmd, live, args})
    at = nxt + 2 + nargs
  end
  return ops, perLock
end

-- refusedAny returns why this user may not run one of ops (see check), or
-- nil.
function changes.refusedAny(ops)
  for _, op in ipairs(ops) do
    local r = changes.check(op)
    if r then return r end
  end
end

-- unfit returns why ops cannot all run, checked before any of them does:
-- the user's rights on each (and TYPE on its key), then each key's type,
-- the first op on a key deciding its type for the ops after it (HSET then
-- SADD on a missing key would write the hash, then fail on the SADD). It
-- returns {NO_RIGHT, ...}, {UNKNOWN_CMD, ...}, {WRONG_TYPE, key, type}, or
-- nil. Every key must be in the script's slot.
function changes.unfit(ops)
  local kinds = {}
  for _, op in ipairs(ops) do
    local r = changes.check(op) or changes.refused('TYPE', op[2])
    if r then return r end
    r = changes.mistyped(op, kinds[op[2]] or redis.call('TYPE', op[2])['ok'])
    if r then return r end
    kinds[op[2]] = changes.types[op[1]]
  end
end

-- runAll applies ops, in order.
function changes.runAll(ops)
  for _, op in ipairs(ops) do
    changes.run(op)
  end
end

-- loggingEach returns, per lock i of n (KEYS[i], its record KEYS[n + i],
-- its cut-over mark KEYS[marks + i] when marks is not nil) with ops in
-- perLock, whether its run logs them (changes.logging), or the refusal of
-- the first that refuses them.
function changes.loggingEach(n, perLock, marks)
  local logging = {}
  for i = 1, n do
    if perLock[i] then
      local r = changes.logging(i, KEYS[i], KEYS[n + i], perLock[i], marks and KEYS[marks + i])
      if r ~= true and r ~= false then return nil, r end
      logging[i] = r
    end
  end
  return logging
end

-- notCurrent returns why the registry reg does not mark generation g, the
-- one its index's pointer names, current (a state no run leaves: the
-- registry lost or written by hand), or nil when it does. genapply and
-- genlog refuse a change then, writing nothing.
function changes.notCurrent(reg, g)
  local st = redis.call('HGET', reg, g)
  if not st then
    return 'the pointer names generation ' .. g .. ', which the registry ' .. reg .. ' does not hold'
  elseif st ~= 'current' then
    return 'the pointer names generation ' .. g .. ', which the registry ' .. reg .. ' marks ' ..
      string.format('%q', st) .. ', not current'
  end
end

-- manifests lists keys in the manifests of generations (genapply.lua,
-- which writes a change on the current generation's keys, and flip.lua,
-- which replays the tail onto the new generation's): the removal of a
-- generation whose run marked its manifest listed reads the manifest
-- rather than SCANning, so every key written in it must be listed, in the
-- step of the write. add(i, key) notes key, written in the generation of
-- index i; unfit(i, manifest) returns why manifest, index i's, cannot list
-- the keys noted for it (not a set, or a SADD this user may not run), or
-- nil, checked before the first write; list(i, manifest) adds them.
function changes.manifests()
  local noted, seen = {}, {}
  local m = {}
  function m.add(i, key)
    noted[i], seen[i] = noted[i] or {}, seen[i] or {}
    if not seen[i][key] then
      seen[i][key] = true
      table.insert(noted[i], key)
    end
  end
  function m.unfit(i, manifest)
    if not noted[i] then return nil end
    local r = changes.refused('SADD', manifest, 'x')
    if r then return nil, r end
    local kind = redis.call('TYPE', manifest)['ok']
    if kind ~= 'set' and kind ~= 'none' then
      return 'its generation\'s manifest ' .. manifest .. ' is a ' .. kind
    end
  end
  function m.list(i, manifest)
    local ks = noted[i] or {}
    -- In chunks: unpack is bounded by Lua's stack.
    for at = 1, #ks, 1000 do
      redis.call('SADD', manifest, unpack(ks, at, math.min(at + 999, #ks)))
    end
  end
  return m
end

-- canLog returns why this user may not log a change for the run holding
-- lock (its record, its log), or nil: checked before the first write.
function changes.canLog(lock, record, log, mark)
  return (mark and (changes.refused('GET', mark) or changes.refused('PTTL', mark)))
    or changes.refused('GET', lock) or changes.refused('PTTL', lock)
    or changes.refused('HMGET', record, 'token') or changes.refused('HINCRBY', record, 'logged', '1')
    or changes.refused('RPUSH', log, 'x') or changes.refused('PEXPIRE', log, '1') or changes.refused('LLEN', log)
end

-- logging returns whether a run holds lock i (KEYS of lock, record) and
-- logs ops, whose live keys are their second fields: true when the
-- record carries the lock's token, the mode "rebuild", the version this
-- script knows, and names the run's keys, every op's key being one of
-- them; false when no run holds the lock. Else it returns the refusal:
-- {UNLOGGED, i, why, detail} or {NOT_THE_RUNS, i, key, owner} (see
-- apply.lua), or {WAIT, i, pttl} when mark, the lock's cut-over mark (nil:
-- none), holds the lock's token: the run that holds it is draining its log
-- to flip, for at most pttl more milliseconds, and the caller applies the
-- change again once it is gone.
function changes.logging(i, lock, record, ops, mark)
  local holder = redis.call('GET', lock)
  if not holder then return false end
  if mark and redis.call('GET', mark) == holder then
    return {WAIT, i, redis.call('PTTL', mark)}
  end
  local rec = redis.call('HMGET', record, 'token', 'v', 'mode', 'keys', 'families')
  if not rec[1] then
    return {UNLOGGED, i, 'none', ''}
  elseif rec[1] ~= holder then
    return {UNLOGGED, i, 'token', ''}
  elseif rec[2] ~= '2' then
    return {UNLOGGED, i, 'version', rec[2] or ''}
  elseif rec[3] ~= 'rebuild' then
    return {UNLOGGED, i, 'mode', rec[3] or ''}
  end
  local owner = keyshapes.first(rec[4])
  if not owner then
    return {UNLOGGED, i, 'keys', ''}
  end
  local family = string.sub(rec[5] or '', 1, 1) == '1'
  for _, op in ipairs(ops) do
    if not keyshapes.owns(op[2], owner, family) then
      return {NOT_THE_RUNS, i, op[2], owner}
    end
  end
  return true
end

-- log appends ops (on their live keys) to the log of the run holding lock,
-- counted in its record in the same step, unless the log holds bound
-- entries: it returns LOGGED, or LOG_FULL (the log gets the entry
-- "!overrun" once, and the run fails). A log this creates gets the lock's
-- remaining TTL.
function changes.log(lock, record, log, ops, bound)
  local len = redis.call('LLEN', log)
  local logged = LOG_FULL
  if len < bound then
    redis.call('RPUSH', log, changes.encode(ops))
    redis.call('HINCRBY', record, 'logged', 1)
    redis.call('HINCRBY', record, 'work', changes.work(ops))
    logged = LOGGED
  elseif len == bound then
    redis.call('RPUSH', log, changes.overrun)
    redis.call('HINCRBY', record, 'logged', 1)
  end
  if len == 0 then
    local ttl = redis.call('PTTL', lock)
    if ttl > 0 then
      redis.call('PEXPIRE', log, ttl)
    end
  end
  return logged
end

-- logEach logs, for each lock i of n (KEYS[i], its record KEYS[n + i],
-- its log KEYS[2n + i]) that logging marks, the ops of perLock[i], and
-- returns {OK, l1..ln}: LOGGED, LOG_FULL, or LOG_NONE for a lock no run
-- of which logs the change.
function changes.logEach(n, logging, perLock, bound)
  local out = {OK}
  for i = 1, n do
    local logged = LOG_NONE
    if logging[i] then
      logged = changes.log(KEYS[i], KEYS[n + i], KEYS[2 * n + i], perLock[i], bound)
    end
    out[#out + 1] = logged
  end
  return out
end
