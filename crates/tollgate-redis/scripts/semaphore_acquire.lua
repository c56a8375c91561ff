-- semaphore_acquire.lua: take a slot of a FIFO semaphore, or join / stay in its wait queue.
-- (semaphore_lib.lua is prepended: KEYS[1..5] and the helpers are described there.)
--
-- KEYS[1..5]  holders, tokens, queue, waiters, fence (see semaphore_lib.lua).
-- ARGV[1]   id: "<instance>:<n>", the lease id if granted, the waiter id while queued.
-- ARGV[2]   capacity N (every user of the semaphore must pass the same N).
-- ARGV[3]   lease TTL in milliseconds.
-- ARGV[4]   mode: 0 = try (never queue; only a slot no queued waiter is entitled to),
--                 1 = wait (join the queue if not in it, refresh the heartbeat, take a slot
--                     when fewer than N - holders waiters are ahead).
-- ARGV[5]   waiter heartbeat TTL in milliseconds (also the wake-up list TTL).
-- ARGV[6]   wake-up list prefix.
--
-- Returns {granted (0|1), token or ahead, holders, queued, next_us}:
--   granted = 1: the fencing token; holders and queued after the grant; next_us = lease TTL µs.
--   granted = 0: waiters ahead of the caller (try: the whole queue); holders and queued now;
--                next_us = µs until the earliest lease or heartbeat expiry (0: none).
-- Expired holders and waiters are purged before counting; if that freed slots, the waiters now
-- entitled to them are woken. Never more than N holders.

local now = now_us()
local id = ARGV[1]
local capacity = tonumber(ARGV[2])
local lease_us = tonumber(ARGV[3]) * 1000
local mode = tonumber(ARGV[4])
local waiter_ms = tonumber(ARGV[5])
local prefix = ARGV[6]

local changed = purge(now)
local result

if redis.call('ZSCORE', H, id) then
  -- Already granted (a retried call): the same answer again.
  local token = tonumber(redis.call('HGET', T, id)) or 0
  result = { 1, token, redis.call('ZCARD', H), redis.call('ZCARD', Q), lease_us }
else
  local holders = redis.call('ZCARD', H)
  local ahead
  if mode == 1 then
    ahead = redis.call('ZRANK', Q, id)
    if not ahead then
      redis.call('ZADD', Q, fmt(next_token(now)), id)
      ahead = redis.call('ZCARD', Q) - 1
    end
    redis.call('ZADD', W, fmt(now + waiter_ms * 1000), id)
  else
    ahead = redis.call('ZCARD', Q)
  end
  if holders + ahead < capacity then
    redis.call('ZREM', Q, id)
    redis.call('ZREM', W, id)
    local token = next_token(now)
    redis.call('ZADD', H, fmt(now + lease_us), id)
    redis.call('HSET', T, id, fmt(token))
    result = { 1, token, holders + 1, redis.call('ZCARD', Q), lease_us }
  else
    result = { 0, ahead, holders, redis.call('ZCARD', Q), next_change(now) }
  end
end

if changed then
  wake(capacity, prefix, waiter_ms, id)
end
expire_keys(now)
return result
