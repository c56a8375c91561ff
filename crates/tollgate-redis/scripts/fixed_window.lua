-- fixed_window.lua: fixed-window counters, one or more decided together, all-or-nothing.
-- A window opens at the first admitted request after the previous one ended (as Limitador).
-- Written for one call; run in batches of calls (batch.lua wraps it, scripts.rs's `batched!`).
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
-- Returns {admitted (0|1), limit, remaining, reset_us, retry_us, now_us[, wait_us]}: reply
--          (all_or_nothing.lua).
-- A key lives until its window ends.

local now = now_us(ARGV[1])  -- from clock.lua, prepended
local n = tonumber(ARGV[2])
local mode = ARGV[3]

-- Does every window admit? (decide: from all_or_nothing.lua, prepended)
local windows = {}
for i, key in ipairs(KEYS) do
  local lim = tonumber(ARGV[6 + 2 * (i - 1)])
  local period = tonumber(ARGV[7 + 2 * (i - 1)])
  local start, count, open = fixed_state(key, period, now)  -- from window_lib.lua, prepended
  windows[i] = {lim = lim, period = period, start = start, count = count, open = open, fits = count + n <= lim}
end
local admitted = decide(windows)

-- Taken only if all admitted; metadata of the state each window is left in.
local take = admitted == 1 and n > 0 and mode ~= '0'
local min_ttl = take and tonumber(ARGV[5])  -- read where used: each tonumber is a strtod
local meta = {reset = 0, retry = 0}  -- folded by tighter (all_or_nothing.lua)
for i, key in ipairs(KEYS) do
  local w = windows[i]
  local ends = w.start + w.period - now
  if take then
    local count = w.count + n
    fixed_store(key, w, count, math.max(math.ceil(ends / 1000), 1, min_ttl))
    local retry = 0
    if count >= w.lim then retry = ends end
    tighter(meta, w.lim, w.lim - count, ends, retry)
  else
    local remaining, reset, retry = math.max(w.lim - w.count, 0), 0, 0
    if w.count > 0 then reset = ends end
    if not w.fits then
      retry = ends
    elseif remaining == 0 then
      retry = reset
    end
    tighter(meta, w.lim, remaining, reset, retry)
  end
end
return reply(admitted, meta, now, 0)
