-- fixed_window.lua: fixed-window counters, one or more decided together, all-or-nothing.
-- A window opens at the first admitted request after the previous one ended (as Limitador).
-- Written for one call, at offsets into the run's KEYS and ARGV (batch.lua wraps it as
-- decide_call(k, a, nkeys, r), scripts.rs's `batched!`): its KEYS[i] below is KEYS[k + i - 1], its
-- ARGV[j] is ARGV[a + j - 1]; it writes its reply at answer[r + 1 ..]. The time (NOW, on the server's TIME
-- or the caller's clock) and the minimum key TTL (MIN_TTL, ms) are the run's (run.lua).
--
-- KEYS[i]   counter i: a hash {s = window start (µs), c = count}. Keys share a hash tag.
-- ARGV[1]   n: permits asked for (0 = probe).
-- ARGV[2]   mode: 0 = check (take nothing), 1 = take.
-- ARGV[3]   unused (max_wait; windows do not reserve).
-- ARGV[4 + 2(i-1)]  counter i: limit.
-- ARGV[5 + 2(i-1)]  counter i: period in microseconds.
--
-- Returns {admitted (0|1), limit, remaining, reset_us, retry_us, now_us[, wait_us]}: reply
--          (all_or_nothing.lua).
-- A key lives until its window ends.

local now = NOW  -- from run.lua, prepended
local n = ARGV[a] + 0
local mode = ARGV[a + 1]

-- Does every window admit? (decide: from all_or_nothing.lua, prepended)
for i = 1, nkeys do
  local lim = ARGV[a + 1 + 2 * i] + 0  -- ARGV[4 + 2(i-1)]
  local period = ARGV[a + 2 + 2 * i] + 0
  local start, count, open = fixed_state(KEYS[k + i - 1], period, now)  -- from window_lib.lua, prepended
  local w = PARTS[i] or part(i, {lim = 0, period = 0, start = 0, count = 0, open = false, fits = false})
  w.lim, w.period, w.start, w.count, w.open, w.fits = lim, period, start, count, open, count + n <= lim
end
local admitted = decide(nkeys)

-- Taken only if all admitted; metadata of the state each window is left in.
local take = admitted == 1 and n > 0 and mode ~= '0'
local meta = {reset = 0, retry = 0}  -- folded by tighter (all_or_nothing.lua)
for i = 1, nkeys do
  local w = PARTS[i]
  local ends = w.start + w.period - now
  if take then
    local count = w.count + n
    fixed_store(KEYS[k + i - 1], w.start, w.period, w.open, w.count, count, now, MIN_TTL)
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
reply(r, admitted, meta, now, 0)
