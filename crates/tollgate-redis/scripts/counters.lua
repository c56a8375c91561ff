-- counters.lua: the rate-limit server's counters: fixed windows of different limits decided
-- together, reporting every counter (Envoy wants a status per descriptor). A window opens at the
-- first hit after the previous one ended (as Limitador, and as tollgate's FixedWindow).
-- Written for one call, at offsets into the run's KEYS and ARGV (batch.lua wraps it as
-- decide_call(k, a, nkeys, r), scripts.rs's `batched!`): its KEYS[i] below is KEYS[k + i - 1], its
-- ARGV[j] is ARGV[a + j - 1]; it writes its reply at answer[r + 1 ..]. The time (NOW, on the server's TIME
-- or the caller's clock) and the minimum key TTL (MIN_TTL, ms) are the run's (run.lua).
--
-- KEYS[i]   counter i: its window's count, expiring when the window ends (fixed_lib.lua). Keys
--           share a hash tag.
-- ARGV[1]   mode: 0 = check (take nothing), 1 = check and take: every counter takes its hits if
--           they fit in every enforcing counter, else none does (a counter that does not
--           enforce takes its hits only if they fit),
--           2 = report: each counter takes its hits if they fit, on its own;
--           3 = flush: each counter takes its hits, or what is left of its limit if less (a
--               cache's hits that were already allowed, counted as far as the window can hold them).
-- ARGV[2 + 3(i-1)]  counter i: limit (max_value).
-- ARGV[3 + 3(i-1)]  counter i: window in microseconds.
-- ARGV[4 + 3(i-1)]  counter i: its role and hits, one word (each argument costs Redis about 800
--                   instructions; the rare parts are read only when the word is longer than one
--                   character):
--   '1'   enforcing; '0' never denies (a shadow or quota limit); '2' charged: never denies, and
--         mode 1 takes its hits (or what is left of its limit if less) whatever the call's
--         outcome (a limit that counts every hit past itself; its limit is then what it can
--         hold); 'p' and a number: pooled: charged as '2', and over when its count (after the
--         call's hits) passes that number; when every pooled counter of the call is over, the
--         call is not admitted (envoy/ratelimit's quota_mode). Then, optionally:
--   '*' hits  the hits the call counts on it: 0 = a probe; 1 when not given.
--   '@' start '-' end  a calendar window: its start and end in microseconds on the same clock as
--         now. A counter stored for another start is from another window: it starts at 0.
--   '~' ago  for a window opened by the first hit, how long ago (µs) the caller saw that hit (a
--         cache flushing the hits it allowed): a window not stored yet starts then rather than
--         now, so that it is the caller's. Below the window's length.
--   e.g. '1', '1*0', 'p500*3', '0@1700000000000000-1700000060000000', '1~250000'.
--
-- Replies {admitted (0|1), then for each counter i: remaining_i, reset_us_i}, counters as they
-- are after the call; remaining_i is -(remaining + 1) when counter i alone had no room (in modes
-- 0 and 1), enforcing or not: a small reply, as Redis converts each element. A key lives until its
-- window ends.
--
-- Cost: a call admitted in an open window takes one INCRBY and one PTTL per counter (a window
-- that opens: INCRBY and PEXPIRE; one that denies: a DECRBY more), with integer replies; numbers
-- are converted by arithmetic, once each (clock.lua); a counter's state is its part's table, kept
-- across the calls of a run (all_or_nothing.lua) (`.ci/redis-instructions counters`).

local now = NOW  -- from run.lua, prepended
local mode = ARGV[a]
local any_pooled = false
if FIXED_RUN ~= RUN then fixed_clock(now, SHIFT, RUN) end  -- once a run (fixed_lib.lua; SHIFT, RUN: run.lua)

-- Does every enforcing counter admit? (part, decide: from all_or_nothing.lua, prepended) A
-- counter the call may count on takes its hits at once (fixed_take: INCRBY), before the call is
-- decided, and gives back what it must not keep afterwards: a decision that admits writes
-- nothing more.
for i = 1, nkeys do
  local at = a - 2 + 3 * i  -- ARGV[2 + 3(i-1)]
  -- The period stays text until a window opens (a conversion is a strtod: an open window has no
  -- use for it).
  local lim, period, role = ARGV[at] + 0, ARGV[at + 1], ARGV[at + 2]
  local kind, hits, text, pooled, till, ago = role, 1, '1', nil, nil, nil
  local opens, after = nil, now  -- where a window opening now ends (nil: now + period); what an open one outlasts
  if #role > 1 then
    kind = string.sub(role, 1, 1)
    text = string.match(role, '%*(%d+)') or '1'
    hits = text + 0
    pooled = tonumber(string.match(role, '^p(%d+)'))
    local from
    from, till = string.match(role, '@(%d+)-(%d+)')
    ago = tonumber(string.match(role, '~(%d+)'))
    if till then
      from, till = from + 0, till + 0
      period, opens = till - from, till
      if from > now then after = from end  -- a window stored before this one started is older
    elseif ago then
      period = period + 0
      local start = now - math.min(ago, period - 1)
      if start < 0 then start = 0 end
      opens = start + period
    end
  end
  local key, taken = KEYS[k + i - 1], hits > 0 and mode ~= '0'
  local count, ends, new = fixed_part(PARTS, i, key, taken, text, hits, opens, after, period)  -- fixed_lib.lua
  local w = PARTS[i] or part(i, {key = '', lim = 0, hits = 0, text = '', count = 0, ends = 0, new = false, taken = false,
                                  charge = false, pooled = false, calendar = false, fits = false, enforce = false})
  w.key, w.lim, w.hits, w.text, w.count, w.ends, w.new, w.taken = key, lim, hits, text, count, ends, new, taken
  w.charge, w.pooled, w.calendar = kind ~= '1' and kind ~= '0', pooled, till ~= nil
  w.fits, w.enforce = mode == '3' or count + hits <= lim, kind == '1'
  any_pooled = any_pooled or pooled ~= nil
end
local admitted = decide(nkeys)
-- Pooled counters: the call is not admitted when every one is over with its hits.
if any_pooled then
  local under = false
  for i = 1, nkeys do
    local w = PARTS[i]
    if w.pooled and w.count + w.hits <= w.pooled then under = true end
  end
  if not under then admitted = 0 end
end

answer[r + 1] = admitted
for i = 1, nkeys do
  local w = PARTS[i]
  local fits, count, lim = w.fits, w.count, w.lim
  local keep = count  -- the count the counter ends the call at
  if w.hits > 0 and ((mode == '1' and ((admitted == 1 and fits) or w.charge)) or (mode == '2' and fits) or mode == '3') then
    if count + w.hits <= lim then keep = count + w.hits elseif lim > count then keep = lim end
  end
  if w.taken and keep ~= count + w.hits then  -- fixed_untake, fixed_trim: from fixed_lib.lua
    if keep == count then
      fixed_untake(w.key, w.text, w.new)
    else
      fixed_trim(w.key, count + w.hits - keep)
    end
  end
  -- Compared, not math.max: a call to a library function costs about 700 instructions.
  local reset, remaining = 0, lim - keep
  if keep > 0 or w.calendar then reset = w.ends - now end
  if reset < 0 then reset = 0 end
  if remaining < 0 then remaining = 0 end
  if not fits and (mode == '0' or mode == '1') then remaining = -remaining - 1 end
  answer[r + 2 * i] = remaining
  answer[r + 2 * i + 1] = reset
end
