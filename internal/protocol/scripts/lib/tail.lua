-- lib/tail.lua: the tail of a run's logs of changes, which the publish
-- replays itself (the entries logged after those the run replayed), so
-- that no change can fall between the run's last catch-up and the
-- publish. Shared by publish.lua, which replays it onto the live keys
-- after its renames, and flip.lua, which replays it onto the keys of the
-- run's new generations; each includes it after keys, remove, changes and
-- fence. The logs are input from other processes, so the tail is checked
-- as the run's catch-up checks them: each log's length against the count
-- its record keeps and the highest count the run saw, and every entry: a
-- change as keyswap encodes it, whose keys are the builder's. The tail is
-- bounded in entries and in work (ops and arguments): a longer one is
-- refused before it is read, and the run catches up again.
local tail = {}

-- read reads and checks the tails of n logs, before any write. spec(i)
-- returns, of log i: its key; its record's key (nil: no counts); the
-- entries the run replayed; the highest count of logged entries it saw;
-- the work of the entries it replayed; its builder's key (a family's
-- prefix); and whether that is a family. keyOf(i, key) returns the key an
-- op of log i on the live key key writes; kinds(), called only when there
-- is a tail to read, returns a map of the keys whose type when the tail
-- runs is not the one TYPE reads now (the publish's renames) to that type,
-- or nil and a refusal. It returns the ops, on the
-- keys keyOf names, and the entries of the tails; or nil and the refusal:
-- {LOG_LOST, ...}, {UNCOUNTED, ...} (fence.counted), {BEHIND, i, n, w}
-- (the tails hold n entries of work w, over a bound; log i is the first
-- with a tail), {OVERRUN, i}, {BAD_LOG, i, e, why}, {NOT_THE_RUNS, i, e,
-- key}, {WRONG_TYPE, key, type}, {NO_RIGHT, ...}, {UNKNOWN_CMD, ...}.
function tail.read(n, spec, maxEntries, maxWork, keyOf, kindsOf)
  local behind, work, first, lens = 0, 0, 0, {}
  for i = 1, n do
    local log, record, offset, highest, done = spec(i)
    local len = redis.call('LLEN', log)
    local rec = record and redis.call('HMGET', record, 'logged', 'work') or {}
    local logged, counted = tonumber(rec[1] or '0'), tonumber(rec[2] or '0')
    local r = fence.counted(i, len, logged, highest, offset)
    if r then return nil, r end
    lens[i] = len
    if len > offset then
      behind = behind + len - offset
      work = work + math.max(0, counted - done)
      if first == 0 then first = i end
    end
  end
  -- The counters first: a tail longer than the bounds is refused without
  -- reading it. A counter forged low cannot make the script do more: the
  -- work is counted again below, as the entries are decoded.
  if behind > maxEntries or work > maxWork then
    return nil, {BEHIND, first, behind, work}
  end
  local ops, replayed = {}, 0
  if behind == 0 then return ops, 0 end
  local kinds, refusal = kindsOf()
  if not kinds then return nil, refusal end
  work = 0
  for i = 1, n do
    local log, _, offset, _, _, owner, family = spec(i)
    for j, e in ipairs(redis.call('LRANGE', log, offset, lens[i] - 1)) do
      local index = offset + j - 1
      replayed = replayed + 1
      if e == changes.overrun then
        return nil, {OVERRUN, i}
      end
      local entry, why = changes.decode(e)
      if not entry then
        return nil, {BAD_LOG, i, index, why}
      end
      work = work + changes.work(entry)
      if work > maxWork then
        return nil, {BEHIND, i, behind, work}
      end
      for _, op in ipairs(entry) do
        if not keyshapes.owns(op[2], owner, family) then
          return nil, {NOT_THE_RUNS, i, index, op[2]}
        end
        local w = {op[1], keyOf(i, op[2]), op[3]}
        local r = changes.check(w)
        if r then return nil, r end
        local kind = kinds[w[2]]
        if not kind then
          r = changes.refused('TYPE', w[2])
          if r then return nil, r end
          kind = redis.call('TYPE', w[2])['ok']
        end
        r = changes.mistyped(w, kind)
        if r then return nil, r end
        -- The first op on a key decides its type for the ops after it.
        kinds[w[2]] = changes.types[w[1]]
        ops[#ops + 1] = w
      end
    end
  end
  return ops, replayed
end
