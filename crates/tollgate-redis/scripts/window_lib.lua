-- window_lib.lua: the stored state of the window algorithms, read as of `now`. Not run alone: it
-- is prepended (after clock.lua) to the scripts that read a window, so each call is still one
-- EVALSHA.
--
-- fixed_state(key, period, now) -> start, count
--   A fixed window is a hash {s = start µs, c = count}; one that is empty or over is a new window
--   opening now (count 0).
-- weighted_state(key, period, now) -> index, prev, curr
--   A weighted window is a hash {i = window index, p = previous count, c = current count}, rolled
--   to now's index floor(now / period): one window on, the current count becomes the previous;
--   two or more (or nothing stored), both are 0.

local function fixed_state(key, period, now)
  local stored = redis.call('HMGET', key, 's', 'c')
  local start, count = tonumber(stored[1]) or now, tonumber(stored[2]) or 0
  if count == 0 or now >= start + period then
    start, count = now, 0
  end
  return start, count
end

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

