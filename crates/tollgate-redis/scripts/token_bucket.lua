-- token_bucket.lua: GCRA token buckets, one or more decided together, all-or-nothing.
-- Written for one call, at offsets into the run's KEYS and ARGV (batch.lua wraps it as
-- decide_call(k, a, nkeys, r), scripts.rs's `batched!`): its KEYS[i] below is KEYS[k + i - 1], its
-- ARGV[j] is ARGV[a + j - 1]; it writes its reply at answer[r + 1 ..]. The time (NOW, on the server's TIME
-- or the caller's clock) and the minimum key TTL (MIN_TTL, ms) are the run's (run.lua).
--
-- KEYS[i]   bucket i: a string holding its theoretical arrival time (TAT) in microseconds.
--           All keys of one call share a hash tag (Redis Cluster).
-- ARGV[1]   n: permits asked for (0 = probe: report, take nothing).
-- ARGV[2]   mode: 0 = check (take nothing), 1 = take if it fits now,
--           2 = reserve: take the earliest slot if it is at most max_wait away.
-- ARGV[3]   max_wait in microseconds (mode 2).
-- ARGV[4 + 2(i-1)]  bucket i: emission interval in microseconds (one permit per interval).
-- ARGV[5 + 2(i-1)]  bucket i: burst (most permits at once).
--
-- Returns {admitted (0|1), limit, remaining, reset_us, retry_us, now_us[, wait_us]}: reply
--          (all_or_nothing.lua).
-- A key is written only when permits are taken, and expires when its bucket would be full.

local now = NOW  -- from run.lua, prepended
local n = ARGV[a] + 0
-- Compared as text, and max_wait read only where used: each conversion is a strtod.
local mode = ARGV[a + 1]
local max_wait = mode == '2' and ARGV[a + 2] + 0

-- Does every bucket admit? (decide: from all_or_nothing.lua, prepended)
for i = 1, nkeys do
  local t = ARGV[a + 1 + 2 * i] + 0  -- ARGV[4 + 2(i-1)]
  local burst = ARGV[a + 2 + 2 * i] + 0
  local horizon = now + t * burst
  local tat = redis.call('GET', KEYS[k + i - 1])  -- false when not stored
  local base = now
  if tat then
    tat = tat + 0  -- converted once: a 16-digit strtod is about 2,000 instructions
    if tat > now then base = tat end
  end
  local new_tat = base + n * t
  local b = PARTS[i] or part(i, {t = 0, burst = 0, horizon = 0, base = 0, new_tat = 0, fits = false})
  b.t, b.burst, b.horizon, b.base, b.new_tat = t, burst, horizon, base, new_tat
  -- n == 0: a probe answers even over the limit (a settled reservation's debt).
  b.fits = new_tat <= horizon or (max_wait and new_tat - horizon <= max_wait) or n == 0
end
local admitted = decide(nkeys)

-- Taken only if all admitted; metadata of the state each bucket is left in.
local take = admitted == 1 and n > 0 and mode ~= '0'
local meta, wait = fresh_meta(), 0  -- folded by tighter (all_or_nothing.lua)
for i = 1, nkeys do
  local b = PARTS[i]
  local state_tat = take and b.new_tat or b.base
  -- Compared and divided, not math.floor and math.max: each library call is about 700
  -- instructions.
  local room, remaining = b.horizon - state_tat, 0
  if room > 0 then remaining = (room - room % b.t) / b.t end
  local retry
  if not b.fits then
    retry = b.new_tat - b.horizon
  elseif remaining > 0 then
    retry = 0
  else
    retry = state_tat + b.t - b.horizon
    if retry < 0 then retry = 0 end
  end
  local reset = state_tat - now
  if reset < 0 then reset = 0 end
  tighter(meta, b.burst, remaining, reset, retry)
  if take then
    local over = b.new_tat - b.horizon
    if over > wait then wait = over end
    local ttl = ceil((b.new_tat - now) / 1000) + 1  -- from clock.lua, prepended
    if ttl < MIN_TTL then ttl = MIN_TTL end
    -- Whole numbers below 2^53 (a TAT in µs until the year 2255) written by '%d', an integer's
    -- printf: '%.0f', and the '%.17g' Redis formats a number argument with, are a float's (about
    -- 2,000 instructions each); the text is the same.
    if b.new_tat < 9007199254740992 and ttl < 9007199254740992 then
      redis.call('SET', KEYS[k + i - 1], string.format('%d', b.new_tat), 'PX', string.format('%d', ttl))
    else
      redis.call('SET', KEYS[k + i - 1], string.format('%.0f', b.new_tat), 'PX', ttl)
    end
  end
end
reply(r, admitted, meta, now, wait)
