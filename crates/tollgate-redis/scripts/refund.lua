-- refund.lua: gives permits back to a decision made by token_bucket.lua, fixed_window.lua,
-- weighted_window.lua or sliding_log.lua, as if they had never been taken: what the grant took
-- and still counts at `now` is restored; what has already left its window is not touched.
--
-- KEYS[i]   the decision's keys, in the same order.
-- ARGV[1]   now in microseconds, or '' to read the server's TIME.
-- ARGV[2]   n: permits to give back.
-- ARGV[3]   algorithm: 'token_bucket' | 'fixed_window' | 'weighted_window' | 'sliding_log'.
-- ARGV[4]   granted_at: the decision's time in microseconds (its now_us), on the same clock.
-- ARGV[5]   minimum key TTL in milliseconds (0 in production; tests on a manual clock raise it).
-- ARGV[6]   the expiry shift in ms (fixed_lib.lua's fixed_clock: 0 on Redis TIME).
-- ARGV[7 + 2(i-1)], ARGV[8 + 2(i-1)]  limit i's two numbers, as the decision script took them
--           (token bucket: emission interval µs, burst; the others: limit, period µs).
--
-- Returns the number of permits given back, summed over the keys.

local now = now_us(ARGV[1])  -- from clock.lua, prepended
local n = tonumber(ARGV[2])
local algorithm = ARGV[3]
local granted_at = tonumber(ARGV[4])
local min_ttl = tonumber(ARGV[5])
fixed_clock(now, tonumber(ARGV[6]))  -- from fixed_lib.lua, prepended
local refunded = 0

for i, key in ipairs(KEYS) do
  local a = tonumber(ARGV[7 + 2 * (i - 1)])
  local b = tonumber(ARGV[8 + 2 * (i - 1)])
  if algorithm == 'token_bucket' then
    -- a = emission interval: the TAT moves back n intervals, never before now.
    local tat = tonumber(redis.call('GET', key))
    if tat ~= nil and tat > now then
      local back = math.max(tat - n * a, now)
      refunded = refunded + math.floor((tat - back) / a)
      if back <= now then
        redis.call('DEL', key)
      else
        local ttl = math.max(math.ceil((back - now) / 1000) + 1, min_ttl)
        redis.call('SET', key, string.format('%.0f', back), 'PX', ttl)
      end
    end
  elseif algorithm == 'fixed_window' then
    -- b = period: only the window the grant was counted in (it opened b before its end: on
    -- Redis TIME an end is read to within a millisecond), while it lasts.
    local count, ends = fixed_read(key, now, b)  -- from fixed_lib.lua, prepended
    if count and count > 0 and granted_at >= ends - b - 1000 then
      local k = math.min(n, count)
      fixed_trim(key, k)
      refunded = refunded + k
    end
  elseif algorithm == 'weighted_window' then
    -- b = period: the grant's window is the current one or the previous one (weighted).
    local index, prev, curr = weighted_state(key, b, now)  -- from weighted_lib.lua, prepended
    local at = math.floor(granted_at / b)
    local k = 0
    if at == index then
      k = math.min(n, curr)
      curr = curr - k
    elseif at + 1 == index then
      k = math.min(n, prev)
      prev = prev - k
    end
    if k > 0 then
      redis.call('HSET', key, 'i', index, 'p', prev, 'c', curr)
      refunded = refunded + k
    end
  elseif algorithm == 'sliding_log' then
    -- The grant's members carry its time as their score; any n of them are the same permits.
    local stamp = string.format('%.0f', granted_at)
    local members = redis.call('ZRANGEBYSCORE', key, stamp, stamp, 'LIMIT', 0, n)
    -- In slices: unpack() of thousands of values would overflow Lua's stack.
    for from = 1, #members, 1000 do
      redis.call('ZREM', key, unpack(members, from, math.min(from + 999, #members)))
    end
    refunded = refunded + #members
  else
    return redis.error_reply('refund.lua: unknown algorithm ' .. tostring(algorithm))
  end
end
return refunded
