-- weighted_lib.lua: a weighted window's stored state, read as of `now`. Not run alone: it is
-- prepended (after clock.lua) to the scripts that read a weighted window, so each call is still
-- one EVALSHA.
--
-- weighted_state(key, period, now) -> index, prev, curr
--   A weighted window is a hash {i = window index, p = previous count, c = current count}, rolled
--   to now's index floor(now / period): one window on, the current count becomes the previous;
--   two or more (or nothing stored), both are 0.

local function weighted_state(key, period, now)
  local stored = redis.call('HMGET', key, 'i', 'p', 'c')
  local index = math.floor(now / period)
  local w, prev, curr = tonumber(stored[1]), tonumber(stored[2]) or 0, tonumber(stored[3]) or 0
  if w == nil or index - w >= 2 then
    prev, curr = 0, 0
  elseif index - w == 1 then
    prev, curr = curr, 0
  end
  return index, prev, curr
end
