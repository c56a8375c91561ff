-- debt_lib.lua: what a decision's keys owe and are given back, after the decision: the one copy
-- of both for charge.lua (a failure policy's grants, counted when Redis answers again),
-- refund.lua (a lease given back) and settle.lua (a reservation settled for its actual cost).
-- Not run alone: prepended after clock.lua, fixed_lib.lua and weighted_lib.lua.
--
-- Both take the decision's keys as KEYS[1..keys] and limit i's two numbers at ARGV[7 + 2(i-1)]
-- and ARGV[8 + 2(i-1)] (token bucket: emission interval µs, burst; the others: limit, period
-- µs), the layout the three scripts share; `now` and the key's times are µs on one clock.
--
-- debt_charge(keys, n, algorithm, now, min_ttl) -> nil, or an error reply
--   Counts n permits against each key without asking whether they fit (past the limit if need
--   be): a token bucket's TAT moves n intervals on from max(TAT, now); a fixed or weighted
--   window counts them in its current window (a fixed window opens one now if none is open); a
--   sliding log stamps n members now.
-- debt_refund(keys, n, algorithm, granted_at, now, min_ttl) -> permits given back (summed over
--   the keys), or an error reply
--   Gives back n permits of a grant made at granted_at, as far as they still count at now: a
--   token bucket's TAT moves back (never before now); a window gives back only while the grant's
--   window lasts (a weighted window: it or the next); a log removes the grant's members.

local function debt_charge(keys, n, algorithm, now, min_ttl)
  for i = 1, keys do
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
      return redis.error_reply('debt_lib.lua: unknown algorithm ' .. tostring(algorithm))
    end
  end
end

local function debt_refund(keys, n, algorithm, granted_at, now, min_ttl)
  local refunded = 0
  for i = 1, keys do
    local key = KEYS[i]
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
      return redis.error_reply('debt_lib.lua: unknown algorithm ' .. tostring(algorithm))
    end
  end
  return refunded
end
