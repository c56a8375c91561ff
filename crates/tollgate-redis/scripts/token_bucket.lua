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
--          index of the limiting bucket (1-based; 0 when admitted)}.
-- A key is written only when permits are taken, and expires when its bucket would be full.

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local n = tonumber(ARGV[2])
local mode = tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])
local min_ttl = tonumber(ARGV[5])

local admitted = 1
local limiting = 0
local limit, remaining, reset, retry, wait = nil, nil, 0, 0, 0
local new_tats = {}

for i, key in ipairs(KEYS) do
  local t = tonumber(ARGV[6 + 2 * (i - 1)])
  local burst = tonumber(ARGV[7 + 2 * (i - 1)])
  local horizon = now + t * burst
  local tat = tonumber(redis.call('GET', key)) or 0
  local base = math.max(tat, now)
  local new_tat = base + n * t
  local ok, state_tat, this_retry
  local this_wait = math.max(new_tat - horizon, 0)
  if new_tat <= horizon or (mode == 2 and this_wait <= max_wait) then
    ok = true
    state_tat = (n > 0 and mode ~= 0) and new_tat or base
    this_retry = nil
  else
    ok = false
    state_tat = base
    this_retry = new_tat - horizon
  end
  new_tats[i] = new_tat
  local this_remaining = math.floor(math.max(horizon - state_tat, 0) / t)
  local this_reset = math.max(state_tat - now, 0)
  if this_retry == nil then
    if this_remaining > 0 then this_retry = 0 else this_retry = math.max(state_tat + t - horizon, 0) end
  end
  if not ok and admitted == 1 then
    admitted = 0
    limiting = i
  end
  if remaining == nil or this_remaining < remaining then
    remaining = this_remaining
    limit = burst
  end
  reset = math.max(reset, this_reset)
  retry = math.max(retry, this_retry)
  wait = math.max(wait, ok and this_wait or 0)
end

if admitted == 1 and n > 0 and mode ~= 0 then
  for i, key in ipairs(KEYS) do
    local ttl = math.max(math.ceil((new_tats[i] - now) / 1000) + 1, min_ttl)
    redis.call('SET', key, string.format('%.0f', new_tats[i]), 'PX', ttl)
  end
else
  wait = 0
end
return {admitted, limit, remaining, reset, retry, wait, limiting}
