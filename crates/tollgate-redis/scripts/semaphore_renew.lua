-- semaphore_renew.lua: extend a held lease by its TTL — only if it has not expired.
-- (semaphore_lib.lua is prepended: KEYS[1..5] and the helpers are described there.)
--
-- KEYS[1..5]  holders, tokens, queue, waiters, fence (see semaphore_lib.lua).
-- ARGV[1]   lease id.
-- ARGV[2]   capacity N.
-- ARGV[3]   lease TTL in milliseconds.
-- ARGV[4]   waiter heartbeat TTL in milliseconds.
-- ARGV[5]   wake-up list prefix.
--
-- Returns {renewed (0|1), lease TTL µs}. 0 means the lease is gone (it expired, was released, or
-- Redis lost it): the slot may already belong to someone else, and it is never taken back.

local now = now_us()
local id = ARGV[1]
local capacity = tonumber(ARGV[2])
local lease_us = tonumber(ARGV[3]) * 1000
local waiter_ms = tonumber(ARGV[4])
local prefix = ARGV[5]

-- Expired leases (this one included) are purged first, so a late renewal cannot revive one.
local changed = purge(now)
local result = { 0, 0 }
if redis.call('ZSCORE', H, id) then
  redis.call('ZADD', H, 'XX', fmt(now + lease_us), id)
  result = { 1, lease_us }
end

if changed then
  wake(capacity, prefix, waiter_ms, nil)
end
expire_keys(now)
return result
