-- lib/fence.lua: the checks that fence a run's publish, shared by
-- publish.lua and flip.lua, which run them before any write. fence.run
-- comes first in both (after publish.lua's check of the rights), and runs
-- its checks in this order: the locks hold the run's token, every record
-- carries it, the first record holds every batch the run wrote, the
-- operator did not cancel the run. fence.counted (a log of changes holds
-- what its record counted) and fence.meta (a meta is keyswap's) are run
-- by each script where its own order puts them: publish.lua checks its
-- metas, then its temp keys, then its logs; flip.lua its logs, then each
-- index's registry and meta. Each check returns the refusal, or nil
-- (fence.meta a boolean).
local fence = {}

-- run checks the L locks KEYS[locks + 1..L] against token, then the R
-- records KEYS[records + 1..R]; then, when batches is not nil, that the
-- first record counts at least tonumber(batches) batches; then, when ctl
-- is not nil, that the operator's requests in the key ctl hold no cancel
-- for the run.
function fence.run(token, locks, L, records, R, batches, ctl)
  for i = 1, L do
    if redis.call('GET', KEYS[locks + i]) ~= token then
      return {LOCK_LOST, i}
    end
  end
  for i = 1, R do
    local t = redis.call('HGET', KEYS[records + i], 'token')
    if not t then
      return {NO_RECORD, i}
    elseif t ~= token then
      return {TAMPERED, i}
    end
  end
  if batches then
    local have = tonumber(redis.call('HGET', KEYS[records + 1], 'batches') or '0')
    if have < tonumber(batches) then
      return {WRITES_LOST, have}
    end
  end
  -- An operator's cancel, for this run, read in the same step as the
  -- publish: a cancel accepted before it is never followed by a publish.
  if ctl then
    local c = redis.call('HMGET', ctl, 'token', 'cancel')
    if c[1] == token and c[2] and c[2] ~= '' then
      return {ABORTED}
    end
  end
end

-- counted checks log i, of len entries, against logged, the count its
-- record keeps, and highest, the highest count the run saw: the log lost
-- entries (fewer than counted, or a count that went back, or, when
-- replayed is not nil, fewer than the run replayed), or holds entries
-- nobody counted.
function fence.counted(i, len, logged, highest, replayed)
  if len < logged or logged < highest or (replayed and len < replayed) then
    return {LOG_LOST, i, len, logged}
  elseif len > logged then
    return {UNCOUNTED, i, len, logged}
  end
end

-- meta reports whether the key meta can be keyswap's meta of an index:
-- absent, or a hash whose seq, if any, is an integer HINCRBY takes and can
-- advance (canonical, and far from the int64 limit). Any other would fail
-- its HINCRBY after the first write.
function fence.meta(meta)
  local kind = redis.call('TYPE', meta)['ok']
  local seq = kind == 'hash' and redis.call('HGET', meta, 'seq')
  local canonical = seq == '0' or (seq and string.match(seq, '^[1-9]%d*$') and #seq < 19)
  return not ((kind ~= 'none' and kind ~= 'hash') or (seq and not canonical))
end
