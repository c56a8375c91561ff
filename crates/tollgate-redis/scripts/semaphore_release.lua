-- semaphore_release.lua: give a slot back, or leave the wait queue (the same id is both the
-- waiter id and the lease id, so one script serves a release, a cancelled wait and a max_wait).
-- (semaphore_lib.lua is prepended: KEYS[1..5] and the helpers are described there.)
--
-- KEYS[1..5]  holders, tokens, queue, waiters, fence (see semaphore_lib.lua).
-- ARGV[1]   id.
-- ARGV[2]   capacity N.
-- ARGV[3]   waiter heartbeat TTL in milliseconds.
-- ARGV[4]   wake-up list prefix.
--
-- Returns {was holding (0|1), was queued (0|1)}; {0, 0} when the lease had already expired.
-- Wakes the waiters entitled to the slots that are now free.

local now = now_us()
local id = ARGV[1]
local capacity = tonumber(ARGV[2])
local waiter_ms = tonumber(ARGV[3])
local prefix = ARGV[4]

purge(now)
local held = redis.call('ZREM', H, id)
redis.call('HDEL', T, id)
local queued = redis.call('ZREM', Q, id)
redis.call('ZREM', W, id)

wake(capacity, prefix, waiter_ms, id)
expire_keys(now)
return { held, queued }
