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

return debt_refund(#KEYS, n, algorithm, granted_at, now, min_ttl)  -- from debt_lib.lua, prepended
