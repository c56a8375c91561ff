-- counters_reset.lua: deletes rate-limit server counters (counters.lua's windows), so each starts
-- its next window full, and counts those that held hits in a window still open (the counters a
-- listing shows) as of `now`.
--
-- KEYS[i]   counter i: its window's count, expiring when the window ends (fixed_lib.lua). Keys
--           share a hash tag.
-- ARGV[1]   now in microseconds, or '' to read the server's TIME.
-- ARGV[2]   the expiry shift in ms (fixed_lib.lua's fixed_clock: 0 on Redis TIME).
-- ARGV[1 + 2i]  counter i: window in microseconds (what an earlier layout's key is read with).
-- ARGV[2 + 2i]  counter i: the current calendar window's start in microseconds on the same
--               clock as now (0 for a window opened by its first hit): a counter that ended
--               before it is from an older window.
--
-- Returns the number of counters deleted whose window was open with a count above 0. The read
-- and the delete are one script, so the number is of the state deleted, not of a state read
-- before another call changed it.

local now = now_us(ARGV[1])  -- from clock.lua, prepended
fixed_clock(now, ARGV[2] + 0)  -- from fixed_lib.lua, prepended
local live = 0
for i, key in ipairs(KEYS) do
  -- A key of another type is deleted too, but not counted (fixed_read fails on it).
  local ok, count, ends = pcall(fixed_read, key, now, ARGV[1 + 2 * i] + 0)
  if ok and count and count > 0 and ends > ARGV[2 + 2 * i] + 0 then live = live + 1 end
  redis.call('DEL', key)
end
return live
