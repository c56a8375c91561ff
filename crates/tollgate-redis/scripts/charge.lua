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

local err = debt_charge(#KEYS - 1, n, algorithm, now, min_ttl)  -- from debt_lib.lua, prepended
if err then return err end
redis.call('SET', marker, ARGV[2], 'PX', 3600000)
return n
