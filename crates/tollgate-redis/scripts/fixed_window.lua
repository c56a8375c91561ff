-- fixed_window.lua: fixed-window counters, one or more decided together, all-or-nothing.
-- A window opens at the first admitted request after the previous one ended (as Limitador).
-- Written for one call, at offsets into the run's KEYS and ARGV (batch.lua wraps it as
-- decide_call(k, a, nkeys, r), scripts.rs's `batched!`): its KEYS[i] below is KEYS[k + i - 1], its
-- ARGV[j] is ARGV[a + j - 1]; it writes its reply at answer[r + 1 ..]. The time (NOW, on the server's TIME
-- or the caller's clock) and the minimum key TTL (MIN_TTL, ms) are the run's (run.lua).
--
-- KEYS[i]   counter i: its window's count, expiring when the window ends (fixed_lib.lua). Keys
--           share a hash tag.
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
local text = ARGV[a]
local n = text + 0
local mode = ARGV[a + 1]
if FIXED_RUN ~= RUN then fixed_clock(now, SHIFT, RUN) end  -- once a run (fixed_lib.lua; SHIFT, RUN: run.lua)

-- A call that takes counts its permits at once (fixed_take: INCRBY) and gives them back if it is
-- not admitted: an admitted call writes nothing more.
local taken = n > 0 and mode ~= '0'
for i = 1, nkeys do
  local lim = ARGV[a + 1 + 2 * i] + 0  -- ARGV[4 + 2(i-1)]
  local period = ARGV[a + 2 + 2 * i]  -- text until a window opens (fixed_lib.lua)
  local key = KEYS[k + i - 1]
  local count, ends, new = fixed_part(PARTS, i, key, taken, text, n, nil, now, period)  -- fixed_lib.lua
  local w = PARTS[i] or part(i, {key = '', text = '', lim = 0, count = 0, ends = 0, new = false, taken = false, fits = false})
  w.key, w.text, w.lim, w.count, w.ends, w.new, w.taken = key, text, lim, count, ends, new, taken
  w.fits = count + n <= lim or n == 0  -- a probe answers even over the limit (a settled debt)
end
local admitted = decide(nkeys)

local meta = fresh_meta()  -- folded by tighter (all_or_nothing.lua)
for i = 1, nkeys do
  local w = PARTS[i]
  local ends = w.ends - now
  if taken and admitted == 1 then
    local count = w.count + n
    local retry = 0
    if count >= w.lim then retry = ends end
    tighter(meta, w.lim, w.lim - count, ends, retry)
  else
    if taken then fixed_untake(w.key, text, w.new) end
    local remaining, reset, retry = w.lim - w.count, 0, 0
    if remaining < 0 then remaining = 0 end
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
