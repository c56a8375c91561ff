-- counters.lua: the rate-limit server's counters: fixed windows of different limits decided
-- together, reporting every counter (Envoy wants a status per descriptor). A window opens at the
-- first hit after the previous one ended (as Limitador, and as tollgate's FixedWindow).
-- Written for one call; run in batches of calls (batch.lua wraps it, scripts.rs's `batched!`).
--
-- KEYS[i]   counter i: a hash {s = window start (µs), c = count}. Keys share a hash tag.
-- ARGV[1]   now in microseconds, or '' to read the server's TIME.
-- ARGV[2]   mode: 0 = check (take nothing), 1 = check and take: every counter takes its hits if
--           they fit in every enforcing counter, else none does (a counter that does not
--           enforce takes its hits only if they fit),
--           2 = report: each counter takes its hits if they fit, on its own;
--           3 = flush: each counter takes its hits, or what is left of its limit if less (a
--               cache's hits that were already allowed, counted as far as the window can hold them).
-- ARGV[3]   minimum key TTL in milliseconds (0 in production; tests on a manual clock raise it).
-- ARGV[4 + 7(i-1)]  counter i: limit (max_value).
-- ARGV[5 + 7(i-1)]  counter i: window in microseconds.
-- ARGV[6 + 7(i-1)]  counter i: hits (0 = probe).
-- ARGV[7 + 7(i-1)]  counter i: 1 = enforcing, 0 = never denies (a shadow or quota limit),
--                   2 = charged: never denies, and mode 1 takes its hits (or what is left of
--                   its limit if less) whatever the call's outcome (a limit that counts every
--                   hit past itself; its limit is then what it can hold),
--                   'p' and a number = pooled: charged as 2, and over when its count (after the
--                   call's hits) passes that number; when every pooled counter of the call is
--                   over, the call is not admitted (envoy/ratelimit's quota_mode).
-- ARGV[8 + 7(i-1)]  counter i: a calendar window's start in microseconds on the same clock as
--                   now (0 for a window opened by the first hit).
-- ARGV[9 + 7(i-1)]  counter i: that calendar window's end; 0 for a window opened by the first
--                   hit. A counter stored for another start is from another window: it starts
--                   at 0.
-- ARGV[10 + 7(i-1)] counter i: for a window opened by the first hit, how long ago (µs) the
--                   caller saw that hit (a cache flushing the hits it allowed): a window not
--                   stored yet starts then rather than now, so that it is the caller's. Below
--                   the window's length; 0 otherwise.
--
-- Returns {admitted (0|1), then for each counter i: remaining_i, reset_us_i}, counters as they
-- are after the call; remaining_i is -(remaining + 1) when counter i alone had no room (in modes
-- 0 and 1), enforcing or not: a small reply, as Redis converts each element. A key lives until its
-- window ends; a window's start is written when it opens, then only its count moves (HINCRBY).
--
-- Cost: the fields a decision does not need are not converted (a calendar's and `ago` are
-- compared with '0' first), and an open window takes one HMGET and one HINCRBY
-- (`.ci/redis-instructions counters`).

local now = now_us(ARGV[1])  -- from clock.lua, prepended
local mode = ARGV[2]

-- Does every enforcing counter admit? (decide: from all_or_nothing.lua, prepended)
local any_pooled = false
local windows = {}
for i, key in ipairs(KEYS) do
  local at = 4 + 7 * (i - 1)
  local lim, period, hits = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local role = ARGV[at + 3]
  local enforce, charge, pooled = role == '1', role == '2', nil
  if not enforce and not charge and role ~= '0' then
    pooled, charge, any_pooled = tonumber(string.sub(role, 2)), true, true
  end
  -- fixed_state, fixed_store: from window_lib.lua, prepended
  local calendar, start, count, open = ARGV[at + 5] ~= '0', nil, nil, nil
  if calendar then
    local astart = tonumber(ARGV[at + 4])
    start, count, open = fixed_state(key, period, now, astart)
    period = tonumber(ARGV[at + 5]) - astart
  else
    start, count, open = fixed_state(key, period, now)
    if not open and ARGV[at + 6] ~= '0' then start = math.max(now - math.min(tonumber(ARGV[at + 6]), period - 1), 0) end
  end
  windows[i] = {start = start, count = count, lim = lim, period = period, hits = hits, enforce = enforce,
                charge = charge, pooled = pooled, open = open, calendar = calendar,
                fits = mode == '3' or count + hits <= lim}
end
local admitted = decide(windows)
-- Pooled counters: the call is not admitted when every one is over with its hits.
if any_pooled then
  local under = false
  for _, w in ipairs(windows) do
    if w.pooled and w.count + w.hits <= w.pooled then under = true end
  end
  if not under then admitted = 0 end
end

local answer = {admitted}
for i, key in ipairs(KEYS) do
  local w = windows[i]
  if w.hits > 0 and ((mode == '1' and ((admitted == 1 and w.fits) or w.charge)) or (mode == '2' and w.fits) or mode == '3') then
    local count = w.count
    if count + w.hits <= w.lim then count = count + w.hits elseif w.lim > count then count = w.lim end
    local ttl = not w.open and math.max(math.ceil((w.start + w.period - now) / 1000), 1, tonumber(ARGV[3]))
    fixed_store(key, w, count, ttl)
    w.count = count
  end
  local reset = 0
  if w.count > 0 or w.calendar then reset = math.max(w.start + w.period - now, 0) end
  local remaining = math.max(w.lim - w.count, 0)
  if not w.fits and (mode == '0' or mode == '1') then remaining = -remaining - 1 end
  answer[2 * i] = remaining
  answer[2 * i + 1] = reset
end
return answer
