-- fixed_window.lua: fixed-window counters, one or more decided together, all-or-nothing.
-- A window opens at the first admitted request after the previous one ended (as Limitador).
--
-- KEYS[i]   counter i: a hash {s = window start (µs), c = count}. Keys share a hash tag.
-- ARGV[1]   now in microseconds, or '' to read the server's TIME.
-- ARGV[2]   n: permits asked for (0 = probe).
-- ARGV[3]   mode: 0 = check (take nothing), 1 = take.
-- ARGV[4]   unused (max_wait; windows do not reserve).
-- ARGV[5]   minimum key TTL in milliseconds.
-- ARGV[6 + 2(i-1)]  counter i: limit.
-- ARGV[7 + 2(i-1)]  counter i: period in microseconds.
--
-- Returns {admitted (0|1), limit, remaining, reset_us, retry_us, 0, index of the limiting counter,
--          now_us (the decision's time)}.
-- A key lives until its window ends.

local now = now_us(ARGV[1])  -- from clock.lua, prepended
local n = tonumber(ARGV[2])
local mode = tonumber(ARGV[3])
local min_ttl = tonumber(ARGV[5])

local admitted, limiting = 1, 0
local limit, remaining, reset, retry = nil, nil, 0, 0
local windows = {}

for i, key in ipairs(KEYS) do
  local lim = tonumber(ARGV[6 + 2 * (i - 1)])
  local period = tonumber(ARGV[7 + 2 * (i - 1)])
  local start, count = fixed_state(key, period, now)  -- from window_lib.lua, prepended
  windows[i] = {start, count, period}
  local this_remaining, this_reset, this_retry
  if count + n > lim then
    if admitted == 1 then admitted, limiting = 0, i end
    this_remaining = math.max(lim - count, 0)
    this_retry = start + period - now
  else
    this_remaining = lim - count
    this_retry = nil
  end
  if count == 0 then this_reset = 0 else this_reset = start + period - now end
  if this_retry == nil then
    if this_remaining > 0 then this_retry = 0 else this_retry = this_reset end
  end
  if remaining == nil or this_remaining < remaining then
    remaining, limit = this_remaining, lim
  end
  reset = math.max(reset, this_reset)
  retry = math.max(retry, this_retry)
end

if admitted == 1 and n > 0 and mode ~= 0 then
  remaining = nil
  reset = 0
  for i, key in ipairs(KEYS) do
    local start, count, period = windows[i][1], windows[i][2] + n, windows[i][3]
    local lim = tonumber(ARGV[6 + 2 * (i - 1)])
    redis.call('HSET', key, 's', string.format('%.0f', start), 'c', count)
    redis.call('PEXPIRE', key, math.max(math.ceil((start + period - now) / 1000), 1, min_ttl))
    if remaining == nil or lim - count < remaining then remaining, limit = lim - count, lim end
    reset = math.max(reset, start + period - now)
  end
  retry = 0
  for i, _ in ipairs(KEYS) do
    local lim = tonumber(ARGV[6 + 2 * (i - 1)])
    if windows[i][2] + n >= lim then
      retry = math.max(retry, windows[i][1] + windows[i][3] - now)
    end
  end
end
return {admitted, limit, remaining, reset, retry, 0, limiting, now}
