-- reset.lua: forgets a limiter key's state in every limit (`RedisLimiter::reset`): its next
-- decision starts full, in every process that shares these keys. Any algorithm: the state of a
-- key is its one Redis key per limit (a bucket's TAT, a window's hash, a log's sorted set).
--
-- KEYS[i]   the keys a decision on the limiter key uses, one per limit. Keys share a hash tag.
-- ARGV      none.
--
-- Returns the number of keys that existed (0: nothing to forget). A script rather than a plain
-- DEL only so that it goes through the same EVALSHA path (deadline, back-off) as the decisions.
return redis.call('DEL', unpack(KEYS))
