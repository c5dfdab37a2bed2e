-- lock.lua: take the single-key API's lock (store.Acquire, Familia's SET
-- NX EX) of a live key whose base another live key can have (SPEC C104),
-- after checking the base's owner stamp in the same step, as acquire.lua
-- does for a run in RenameInPlace mode: it never writes a stamp. Elsewhere
-- the lock is a plain SET NX EX, which needs no script.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the owner stamp of its base ("<base>:rebuild-owner")
-- ARGV[1]  token
-- ARGV[2]  ttl in seconds
-- ARGV[3]  the live key
--
-- Returns {OK}: the lock taken.
--         {OWNED, 1, kind, value}: the stamp is another live key's (kind
--           'string', value its name) or of another type (kind); nothing
--           changed.
--         {HELD, 1}: the lock is held; nothing changed.
-- #include owner
local r = owner.refused(1, KEYS[2], ARGV[3])
if r then return r end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  return {HELD, 1}
end
return {OK}
