-- removeif.lua: HDELIF or ZREMIF (lib/remove.lua) on one key, for a
-- catch-up's transaction; sent with EVAL, which a NOSCRIPT cannot fail.
-- KEYS[1] the key; ARGV[1] the op; ARGV[2..] its args. Returns the count.
-- #include remove
return remove.run(ARGV[1], KEYS[1], {unpack(ARGV, 2)})
