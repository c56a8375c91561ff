-- semaphore_state.lua: how many hold a slot and how many wait, after purging expired ones.
-- (semaphore_lib.lua is prepended: KEYS[1..5] and the helpers are described there.)
--
-- KEYS[1..5]  holders, tokens, queue, waiters, fence (see semaphore_lib.lua).
-- ARGV[1]   capacity N.
-- ARGV[2]   waiter heartbeat TTL in milliseconds.
-- ARGV[3]   wake-up list prefix.
--
-- Returns {holders, queued}. Takes nothing; wakes entitled waiters if the purge freed slots.

local now = now_us()
if purge(now) then
  wake(tonumber(ARGV[1]), ARGV[3], tonumber(ARGV[2]), nil)
end
expire_keys(now)
return { redis.call('ZCARD', H), redis.call('ZCARD', Q) }
