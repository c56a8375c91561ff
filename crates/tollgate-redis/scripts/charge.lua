-- charge.lua: counts permits granted elsewhere (by a failure policy's local limiter while Redis
-- could not answer) against a decision's keys, without asking whether they fit: they are gone.
-- The counterpart of refund.lua; the limits then admit only what is left, so over the outage and
-- after it the keys hold no more than their bound.
--
-- Idempotent: a charge carries everything its outage granted so far, and the outage's marker key
-- keeps the largest total counted, so a charge sent again (its answer was lost) or a late copy
-- landing after a later charge counts only what none counted before.
--
-- KEYS[i]   the decision's keys, in the same order as the decision script takes them; then, last,
--           the outage's marker (the total its charges counted, a string kept an hour: longer
--           than any copy of a charge stays in flight). All share a hash tag.
-- ARGV[1]   now in microseconds, or '' to read the server's TIME.
-- ARGV[2]   total: the permits granted in the outage so far.
-- ARGV[3]   algorithm: 'token_bucket' | 'fixed_window' | 'weighted_window' | 'sliding_log'.
-- ARGV[4]   unused (the decision scripts' fourth argument).
-- ARGV[5]   minimum key TTL in milliseconds (0 in production; tests on a manual clock raise it).
-- ARGV[6]   the expiry shift in ms (fixed_lib.lua's fixed_clock: 0 on Redis TIME).
-- ARGV[7 + 2(i-1)], ARGV[8 + 2(i-1)]  limit i's two numbers, as the decision script takes them
--           (token bucket: emission interval µs, burst; the others: limit, period µs).
--
-- Returns the permits counted now: the total less what the outage's charges counted before (0
-- when they counted it all).

local marker = KEYS[#KEYS]
local n = tonumber(ARGV[2]) - (tonumber(redis.call('GET', marker)) or 0)
if n <= 0 then
  return 0
end
local now = now_us(ARGV[1])  -- from clock.lua, prepended
local algorithm = ARGV[3]
local min_ttl = tonumber(ARGV[5])
fixed_clock(now, tonumber(ARGV[6]))  -- from fixed_lib.lua, prepended

for i = 1, #KEYS - 1 do
  local key = KEYS[i]
  local a = tonumber(ARGV[7 + 2 * (i - 1)])
  local b = tonumber(ARGV[8 + 2 * (i - 1)])
  if algorithm == 'token_bucket' then
    -- a = emission interval: the TAT moves n intervals on from max(TAT, now).
    local tat = math.max(tonumber(redis.call('GET', key)) or 0, now) + n * a
    local ttl = math.max(math.ceil((tat - now) / 1000) + 1, min_ttl)
    redis.call('SET', key, string.format('%.0f', tat), 'PX', ttl)
  elseif algorithm == 'fixed_window' then
    -- a = limit, b = period: counted in the current window, or in one opened now.
    local counted, err = fixed_take(key, string.format('%.0f', n), n, now + b, now, b)  -- from fixed_lib.lua, prepended
    if not counted then return err end
  elseif algorithm == 'weighted_window' then
    -- b = period: counted in the current window.
    local index, prev, curr = weighted_state(key, b, now)
    redis.call('HSET', key, 'i', index, 'p', prev, 'c', curr + n)
    redis.call('PEXPIRE', key, math.max(math.ceil(((index + 2) * b - now) / 1000), 1, min_ttl))
  elseif algorithm == 'sliding_log' then
    -- b = period: n members stamped now, named as sliding_log.lua names them.
    local stamp = string.format('%.0f', now)
    local first = redis.call('ZCOUNT', key, stamp, stamp)
    for j = 1, n do
      redis.call('ZADD', key, stamp, stamp .. ':' .. (first + j))
    end
    redis.call('PEXPIRE', key, math.max(math.ceil(b / 1000), 1, min_ttl))
  else
    return redis.error_reply('charge.lua: unknown algorithm ' .. tostring(algorithm))
  end
end
redis.call('SET', marker, ARGV[2], 'PX', 3600000)
return n
