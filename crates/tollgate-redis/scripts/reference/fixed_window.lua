-- reference/fixed_window.lua: the least work an all-or-nothing fixed-window decision of one
-- counter needs on Redis, to measure tollgate's scripts against (`.ci/redis-instructions`,
-- issue "Redis CPU per decision at the floor"). Not used by any limiter: it keeps no window start
-- (the key's TTL is the window), reads no clock and answers nothing but admitted.
--
-- KEYS[1]  the counter (a string).
-- ARGV[1]  hits; ARGV[2] limit; ARGV[3] window in milliseconds.
-- Returns 1 when the hits fitted (and were counted), else 0 (and nothing is counted).
local count = redis.call('INCRBY', KEYS[1], ARGV[1])
if count == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
if count > tonumber(ARGV[2]) then redis.call('DECRBY', KEYS[1], ARGV[1]) return 0 end
return 1
