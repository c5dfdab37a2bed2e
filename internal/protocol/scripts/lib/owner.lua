-- lib/owner.lua: the check of an owner stamp (keys.OwnerKey, SPEC C104)
-- that a script which never writes one runs before any write: lock.lua,
-- publish.lua, genapply.lua and genlog.lua. (acquire.lua and claim.lua,
-- which may write the stamp, read it themselves.)
local owner = {}

-- refused returns {OWNED, i, kind, value} when stamp, the i-th stamp the
-- script checks, is of another type than a string (kind, value '') or
-- names another live key than live ('string', value its name); nil when
-- it is absent or names live.
function owner.refused(i, stamp, live)
  local kind = redis.call('TYPE', stamp)['ok']
  if kind == 'none' then
    return nil
  elseif kind ~= 'string' then
    return {OWNED, i, kind, ''}
  end
  local v = redis.call('GET', stamp)
  if v ~= live then
    return {OWNED, i, 'string', v}
  end
end
