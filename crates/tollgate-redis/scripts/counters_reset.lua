-- counters_reset.lua: deletes rate-limit server counters (counters.lua's hashes), so each starts
-- its next window full, and counts those that held hits in a window still open (the counters a
-- listing shows) as of `now`.
--
-- KEYS[i]   counter i: a hash {s = window start (µs), c = count}. Keys share a hash tag.
-- ARGV[1]   now in microseconds, or '' to read the server's TIME.
-- ARGV[2 + 3(i-1)]  counter i: window in microseconds (a window opened by its first hit).
-- ARGV[3 + 3(i-1)]  counter i: the current calendar window's start in microseconds on the same
--                   clock as now (0 for a window opened by its first hit).
-- ARGV[4 + 3(i-1)]  counter i: that calendar window's end (0 for a window opened by its first
--                   hit); a counter stored for another start is from an older window.
--
-- Returns the number of counters deleted whose window was open with a count above 0. The read
-- and the delete are one script, so the number is of the state deleted, not of a state read
-- before another call changed it.

local now = now_us(ARGV[1])  -- from clock.lua, prepended
local live = 0
for i, key in ipairs(KEYS) do
  local at = 2 + 3 * (i - 1)
  local period, cstart, cend = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local stored = redis.pcall('HMGET', key, 's', 'c')
  if type(stored) == 'table' then
    local start, count = tonumber(stored[1]), tonumber(stored[2]) or 0
    local finish = nil
    if start and cend > 0 then
      if start == cstart then finish = cend end
    elseif start then
      finish = start + period
    end
    if finish and count > 0 and now < finish then
      live = live + 1
    end
  end
  redis.call('DEL', key)
end
return live
