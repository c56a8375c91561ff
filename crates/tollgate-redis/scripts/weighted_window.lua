-- weighted_window.lua: weighted two-window sliding counters (previous window's count weighted by
-- its overlap with the sliding window, plus the current window's), all-or-nothing.
-- Windows are aligned to multiples of the period since the clock's origin.
-- Written for one call, at offsets into the run's KEYS and ARGV (batch.lua wraps it as
-- decide_call(k, a, nkeys, r), scripts.rs's `batched!`): its KEYS[i] below is KEYS[k + i - 1], its
-- ARGV[j] is ARGV[a + j - 1]; it writes its reply at answer[r + 1 ..]. The time (NOW, on the server's TIME
-- or the caller's clock) and the minimum key TTL (MIN_TTL, ms) are the run's (run.lua).
--
-- KEYS[i]   counter i: a hash {i = window index, p = previous count, c = current count}.
-- ARGV[1]   n: permits asked for (0 = probe).
-- ARGV[2]   mode: 0 = check (take nothing), 1 = take.
-- ARGV[3]   unused.
-- ARGV[4 + 2(i-1)]  counter i: limit.
-- ARGV[5 + 2(i-1)]  counter i: period in microseconds.
--
-- Admits when prev * (P - elapsed) + (curr + n) * P <= limit * P, in exact integers.
-- Returns {admitted (0|1), limit, remaining, reset_us, retry_us, now_us[, wait_us]}: reply
--          (all_or_nothing.lua).
-- A key lives until both of its counts have left the sliding window.

local now = NOW  -- from run.lua, prepended
local n = ARGV[a] + 0
local mode = ARGV[a + 1]

-- floor(x / y) for non-negative integers held in doubles, corrected for rounding.
local function idiv(x, y)
  local q = math.floor(x / y)
  if q * y > x then q = q - 1 end
  if (q + 1) * y <= x then q = q + 1 end
  return q
end

-- Microseconds from now until `hits` more fit, given counts (prev, curr) of window `index`.
local function wait_for(index, prev, curr, lim, p, hits)
  local start = index * p
  local function earliest(pv, cu)
    if cu + hits > lim then return nil end
    if pv == 0 then return 0 end
    return p - math.min(idiv((lim - cu - hits) * p, pv), p)
  end
  local e = earliest(prev, curr)
  if e ~= nil then return math.max(start + e - now, 0) end
  e = earliest(curr, 0) or p
  return math.max(start + p + e - now, 0)
end

local function state_meta(index, prev, curr, lim, p)
  local elapsed = now - index * p
  local weighted = prev * (p - elapsed) + curr * p
  local rem = idiv(math.max(lim * p - weighted, 0), p)
  local rst = 0
  if curr > 0 then rst = (index + 2) * p - now elseif prev > 0 then rst = (index + 1) * p - now end
  return rem, rst, wait_for(index, prev, curr, lim, p, 1)
end

-- Does every counter admit? (decide: from all_or_nothing.lua, prepended)
for i = 1, nkeys do
  local lim = ARGV[a + 1 + 2 * i] + 0  -- ARGV[4 + 2(i-1)]
  local p = ARGV[a + 2 + 2 * i] + 0
  local index, prev, curr = weighted_state(KEYS[k + i - 1], p, now)  -- from weighted_lib.lua, prepended
  local elapsed = now - index * p
  local s = PARTS[i] or part(i, {index = 0, prev = 0, curr = 0, lim = 0, p = 0, fits = false})
  s.index, s.prev, s.curr, s.lim, s.p = index, prev, curr, lim, p
  s.fits = prev * (p - elapsed) + (curr + n) * p <= lim * p or n == 0  -- a probe: even over (a debt)
end
local admitted, limiting = decide(nkeys)

-- Taken only if all admitted; metadata of the state each counter is left in.
local take = admitted == 1 and n > 0 and mode ~= '0'
local meta = fresh_meta()  -- folded by tighter (all_or_nothing.lua)
for i = 1, nkeys do
  local key = KEYS[k + i - 1]
  local s = PARTS[i]
  local curr = s.curr
  if take then
    curr = curr + n
    redis.call('HSET', key, 'i', s.index, 'p', s.prev, 'c', curr)
    redis.call('PEXPIRE', key, math.max(math.ceil(((s.index + 2) * s.p - now) / 1000), 1, MIN_TTL))
  end
  local rem, rst, rty = state_meta(s.index, s.prev, curr, s.lim, s.p)
  if admitted == 0 and i == limiting then rty = wait_for(s.index, s.prev, curr, s.lim, s.p, n) end
  tighter(meta, s.lim, rem, rst, rty)
end
reply(r, admitted, meta, now, 0)
