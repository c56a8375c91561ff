-- semaphore_lib.lua: helpers shared by the semaphore scripts. Not run alone: it is prepended to
-- each semaphore_*.lua script when the script is built, so each call is still one EVALSHA.
--
-- Every semaphore script gets the same five keys, all under the hash tag {name} (Redis Cluster):
-- KEYS[1]   holders: sorted set, member = lease id, score = lease expiry (µs of Redis TIME).
-- KEYS[2]   tokens: hash, lease id -> fencing token.
-- KEYS[3]   queue: sorted set, member = waiter id, score = ticket (FIFO order).
-- KEYS[4]   waiters: sorted set, member = waiter id, score = heartbeat expiry (µs).
-- KEYS[5]   fence: string counter for fencing tokens and queue tickets.
--
-- Ids are "<instance>:<n>" (instance = one RedisSemaphore in one process). The wake-up list of an
-- instance is <wake prefix><instance>: a list of the <n> of its waiters that may take a slot now.
-- It shares the hash tag, so it lives on the same cluster slot as KEYS.
--
-- Time is Redis TIME in microseconds (< 2^53: exact in a Lua number). Numbers passed back to
-- redis.call are formatted with %.0f, because Lua's default formatting loses digits.

local H, T, Q, W, F = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function fmt(x)
  return string.format('%.0f', x)
end

-- Removes holders whose lease expired and waiters that stopped sending heartbeats (a process
-- killed while holding or waiting). Returns true when anything was removed.
local function purge(now)
  local changed = false
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', H, '-inf', fmt(now))) do
    redis.call('ZREM', H, id)
    redis.call('HDEL', T, id)
    changed = true
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', W, '-inf', fmt(now))) do
    redis.call('ZREM', W, id)
    redis.call('ZREM', Q, id)
    changed = true
  end
  -- A queue entry without a heartbeat, or of an id that already holds a lease, waits for nobody:
  -- it would count as "ahead" of every waiter forever and cost a slot. Both were seen after Redis
  -- was paused under load (tests/semaphore.rs, holders_killed_at_random...), cause not yet known.
  -- The head of the queue decides who is granted, so it is checked on every call (at most 16
  -- entries); stale entries further back reach it in turn.
  for _, id in ipairs(redis.call('ZRANGE', Q, 0, 15)) do
    if not redis.call('ZSCORE', W, id) or redis.call('ZSCORE', H, id) then
      redis.call('ZREM', Q, id)
      changed = true
    end
  end
  return changed
end

-- The next fencing token or queue ticket: INCR, never below `now` in µs, so tokens keep growing
-- even after the counter expired with the semaphore's other keys (or Redis restarted empty).
local function next_token(now)
  local v = redis.call('INCR', F)
  if v < now then
    redis.call('SET', F, fmt(now))
    v = now
  end
  return v
end

-- Wakes the waiters entitled to a free slot: the first (capacity - holders) of the queue, except
-- `skip` (the caller). A wake-up is a hint; the waiter runs the acquire script to take the slot.
local function wake(capacity, prefix, ttl_ms, skip)
  local free = capacity - redis.call('ZCARD', H)
  if free <= 0 then
    return
  end
  for _, id in ipairs(redis.call('ZRANGE', Q, 0, free - 1)) do
    if id ~= skip then
      local instance, n = string.match(id, '^(.*):(%d+)$')
      if instance then
        local list = prefix .. instance
        redis.call('RPUSH', list, n)
        redis.call('PEXPIRE', list, ttl_ms)
      end
    end
  end
end

-- Microseconds until the earliest holder or waiter expiry (when a slot or a queue place may free
-- without anyone releasing it), at least 1; 0 when there is none.
local function next_change(now)
  local best
  local h = redis.call('ZRANGE', H, 0, 0, 'WITHSCORES')
  if h[2] then
    best = tonumber(h[2])
  end
  local w = redis.call('ZRANGE', W, 0, 0, 'WITHSCORES')
  if w[2] and (best == nil or tonumber(w[2]) < best) then
    best = tonumber(w[2])
  end
  if best == nil then
    return 0
  end
  return math.max(best - now, 1)
end

-- Keys live until the last lease or heartbeat in them expires; all go when nothing is left.
local function expire_keys(now)
  local horizon = now
  local h = redis.call('ZRANGE', H, -1, -1, 'WITHSCORES')
  if h[2] then
    horizon = math.max(horizon, tonumber(h[2]))
  end
  local w = redis.call('ZRANGE', W, -1, -1, 'WITHSCORES')
  if w[2] then
    horizon = math.max(horizon, tonumber(w[2]))
  end
  if horizon <= now then
    redis.call('DEL', H, T, Q, W, F)
  else
    local ms = math.ceil((horizon - now) / 1000) + 1
    for _, key in ipairs({ H, T, Q, W, F }) do
      redis.call('PEXPIRE', key, ms)
    end
  end
end

