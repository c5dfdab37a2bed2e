-- replay.lua: replay the ops of logged changes onto a run's temp keys, in
-- order, for one transaction of a catch-up: one script for many ops, so that
-- a conditional removal (HDELIF, ZREMIF) runs in its place among the others.
-- The run has checked every op (a change of the log's builder); a command
-- that fails stops the script, and the run, whose temp keys it discards.
--
-- KEYS[1..]   the temp keys the ops write
-- ARGV[1..]   per op: its key's index in KEYS, the command, the count of
--             args, the args
--
-- Returns the number of ops replayed.
-- #include remove
-- #include changes
local at, n = 1, 0
while at <= #ARGV do
  local key, cmd, nargs = KEYS[tonumber(ARGV[at])], ARGV[at + 1], tonumber(ARGV[at + 2])
  changes.run({cmd, key, {unpack(ARGV, at + 3, at + 2 + nargs)}})
  at = at + 3 + nargs
  n = n + 1
end
return n
