-- counters.lua: the rate-limit server's counters: fixed windows of different limits decided
-- together, reporting every counter (Envoy wants a status per descriptor). A window opens at the
-- first hit after the previous one ended (as Limitador, and as tollgate's FixedWindow).
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
-- Returns {admitted (0|1), index of the first enforcing counter without room (1-based; 0 when
--          none), then for each counter i: remaining_i, reset_us_i, limited_i (0|1)}, counters as
-- they are after the call; limited_i says counter i alone had no room, enforcing or not. A key
-- lives until its window ends.

local now = now_us(ARGV[1])  -- from clock.lua, prepended
local mode = tonumber(ARGV[2])
local min_ttl = tonumber(ARGV[3])

-- Does every enforcing counter admit? (read_parts: from all_or_nothing.lua, prepended)
local any_pooled = false
local windows, admitted, limiting = read_parts(function(i, key)
  local at = 4 + 7 * (i - 1)
  local lim, period = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
  local hits, role = tonumber(ARGV[at + 2]), ARGV[at + 3]
  local enforce, charge, pooled = role == '1', role == '2', nil
  if not enforce and not charge and role ~= '0' then
    pooled, charge, any_pooled = tonumber(string.sub(role, 2)), true, true
  end
  local astart, aend = tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5])
  local ago = math.min(tonumber(ARGV[at + 6]), period - 1)
  local stored = redis.call('HMGET', key, 's', 'c')
  local start, count = tonumber(stored[1]) or now, tonumber(stored[2]) or 0
  if aend > 0 then
    if start ~= astart then count = 0 end
    start, period = astart, aend - astart
  elseif count == 0 or now >= start + period then
    start, count = math.max(now - ago, 0), 0
  end
  local fits = mode == 3 or count + hits <= lim
  return {start = start, count = count, lim = lim, period = period, hits = hits, fits = fits, enforce = enforce,
          charge = charge, pooled = pooled}
end)
-- Pooled counters: the call is not admitted when every one is over with its hits.
if any_pooled then
  local under = false
  for _, w in ipairs(windows) do
    if w.pooled and w.count + w.hits <= w.pooled then under = true end
  end
  if not under then admitted = 0 end
end
local function take(i, key)
  local w = windows[i]
  w.count = math.min(w.count + w.hits, math.max(w.lim, w.count))
  redis.call('HSET', key, 's', string.format('%.0f', w.start), 'c', w.count)
  redis.call('PEXPIRE', key, math.max(math.ceil((w.start + w.period - now) / 1000), 1, min_ttl))
end

for i, key in ipairs(KEYS) do
  local w = windows[i]
  if w.hits > 0 and ((mode == 1 and ((admitted == 1 and w.fits) or w.charge)) or (mode == 2 and w.fits) or mode == 3) then
    take(i, key)
  end
end

local reply = {admitted, limiting}
for i, _ in ipairs(KEYS) do
  local w = windows[i]
  local reset = 0
  if w.count > 0 or tonumber(ARGV[9 + 7 * (i - 1)]) > 0 then reset = math.max(w.start + w.period - now, 0) end
  local limited = 0
  if not w.fits and mode < 2 then limited = 1 end
  reply[#reply + 1] = math.max(w.lim - w.count, 0)
  reply[#reply + 1] = reset
  reply[#reply + 1] = limited
end
return reply
