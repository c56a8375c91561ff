-- token_bucket.lua: GCRA token buckets, one or more decided together, all-or-nothing.
--
-- KEYS[i]   bucket i: a string holding its theoretical arrival time (TAT) in microseconds.
--           All keys of one call share a hash tag (Redis Cluster).
-- ARGV[1]   now in microseconds, or '' to read the server's TIME (never the client's clock).
-- ARGV[2]   n: permits asked for (0 = probe: report, take nothing).
-- ARGV[3]   mode: 0 = check (take nothing), 1 = take if it fits now,
--           2 = reserve: take the earliest slot if it is at most max_wait away.
-- ARGV[4]   max_wait in microseconds (mode 2).
-- ARGV[5]   minimum key TTL in milliseconds (0 in production; tests on a manual clock raise it).
-- ARGV[6 + 2(i-1)]  bucket i: emission interval in microseconds (one permit per interval).
-- ARGV[7 + 2(i-1)]  bucket i: burst (most permits at once).
--
-- Returns {admitted (0|1), limit, remaining, reset_us, retry_us (-1 = never), wait_us,
--          index of the limiting bucket (1-based; 0 when admitted), now_us (the decision's time)}.
-- A key is written only when permits are taken, and expires when its bucket would be full.

local now = now_us(ARGV[1])  -- from clock.lua, prepended
local n = tonumber(ARGV[2])
local mode = tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])
local min_ttl = tonumber(ARGV[5])

-- First pass: does every bucket admit?
local admitted, limiting = 1, 0
local buckets = {}
for i, key in ipairs(KEYS) do
  local t = tonumber(ARGV[6 + 2 * (i - 1)])
  local burst = tonumber(ARGV[7 + 2 * (i - 1)])
  local horizon = now + t * burst
  local base = math.max(tonumber(redis.call('GET', key)) or 0, now)
  local new_tat = base + n * t
  local ok = new_tat <= horizon or (mode == 2 and new_tat - horizon <= max_wait)
  if not ok and admitted == 1 then admitted, limiting = 0, i end
  buckets[i] = {t, burst, horizon, base, new_tat, ok}
end

-- Second pass: metadata of the state each bucket is left in (taken only if all admitted).
local take = admitted == 1 and n > 0 and mode ~= 0
local limit, remaining, reset, retry, wait = nil, nil, 0, 0, 0
local new_tats = {}
for i, b in ipairs(buckets) do
  local t, burst, horizon, base, new_tat, ok = unpack(b)
  new_tats[i] = new_tat
  local state_tat = take and new_tat or base
  local this_remaining = math.floor(math.max(horizon - state_tat, 0) / t)
  local this_reset = math.max(state_tat - now, 0)
  local this_retry
  if not ok then
    this_retry = new_tat - horizon
  elseif this_remaining > 0 then
    this_retry = 0
  else
    this_retry = math.max(state_tat + t - horizon, 0)
  end
  if remaining == nil or this_remaining < remaining then remaining, limit = this_remaining, burst end
  reset = math.max(reset, this_reset)
  retry = math.max(retry, this_retry)
  if take then wait = math.max(wait, new_tat - horizon, 0) end
end

if take then
  for i, key in ipairs(KEYS) do
    local ttl = math.max(math.ceil((new_tats[i] - now) / 1000) + 1, min_ttl)
    redis.call('SET', key, string.format('%.0f', new_tats[i]), 'PX', ttl)
  end
end
return {admitted, limit, remaining, reset, retry, wait, limiting, now}
