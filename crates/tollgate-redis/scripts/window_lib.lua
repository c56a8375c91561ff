-- window_lib.lua: the stored state of the window algorithms, read as of `now`. Not run alone: it
-- is prepended (after clock.lua) to the scripts that read a window, so each call is still one
-- EVALSHA.
--
-- fixed_state(key, period, now[, at]) -> start, count, open
--   A fixed window is a hash {s = start µs, c = count}; one that is empty or over is a new window
--   opening now (count 0, open false). `at`: a calendar window's start (µs): the stored window is
--   the current one only if it started then (else a new one opens at `at`).
-- fixed_store(key, start, period, open, before, count, now, min_ttl)
--   Writes a window's count: a window that opens stores its start and lives until it ends (at
--   least 1 and min_ttl ms); one already open moves its count alone (one HINCRBY from `before`:
--   no TTL, no start to format). start, open and before as fixed_state read them. A start of
--   `now` is written as now's text, formatted once per run (a string.format is about 3,000
--   instructions, and most windows open now); the TTL is rounded up by arithmetic, not
--   math.ceil and math.max (a library call is about 700).
-- weighted_state(key, period, now) -> index, prev, curr
--   A weighted window is a hash {i = window index, p = previous count, c = current count}, rolled
--   to now's index floor(now / period): one window on, the current count becomes the previous;
--   two or more (or nothing stored), both are 0.

local function fixed_state(key, period, now, at)
  local stored = redis.call('HMGET', key, 's', 'c')
  local start, count = stored[1], stored[2]  -- false when not stored
  count = count and count + 0 or 0  -- (clock.lua: arithmetic converts once, tonumber twice)
  if at then
    if not start or start + 0 ~= at then return at, 0, false end
    return at, count, count > 0
  end
  if count == 0 then return now, 0, false end
  start = start + 0
  if now >= start + period then return now, 0, false end
  return start, count, true
end

local now_text, now_of_text = nil, nil
local function fixed_store(key, start, period, open, before, count, now, min_ttl)
  if not open then
    local ends = start + period - now
    local ttl = (ends - ends % 1000) / 1000
    if ends % 1000 > 0 then ttl = ttl + 1 end
    if ttl < 1 then ttl = 1 end
    if ttl < min_ttl then ttl = min_ttl end
    local text
    if start == now then
      if now_of_text ~= now then now_text, now_of_text = string.format('%.0f', now), now end
      text = now_text
    else
      text = string.format('%.0f', start)
    end
    redis.call('HSET', key, 's', text, 'c', count)
    redis.call('PEXPIRE', key, ttl)
  elseif count ~= before then
    redis.call('HINCRBY', key, 'c', count - before)
  end
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

