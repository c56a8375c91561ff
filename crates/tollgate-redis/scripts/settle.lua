-- settle.lua: settles a reservation (a grant of its estimate by token_bucket.lua,
-- fixed_window.lua, weighted_window.lua or sliding_log.lua) for its actual cost: gives back what
-- the estimate exceeded, as refund.lua does, or charges the rest past the limit, as charge.lua
-- does (a debt the keys' next requests pay first). Once per reservation: its marker is set
-- with the settle, and a settle that finds it set (one sent again after its answer was lost,
-- or a late copy) changes nothing.
--
-- KEYS[i]   the decision's keys, in the same order as the decision script takes them; then, last,
--           the reservation's marker (kept an hour: longer than any copy of a settle stays in
--           flight). All share a hash tag.
-- ARGV[1]   now in microseconds, or '' to read the server's TIME.
-- ARGV[2]   actual - estimate: > 0 charges it, < 0 gives its opposite back, 0 only marks.
-- ARGV[3]   algorithm: 'token_bucket' | 'fixed_window' | 'weighted_window' | 'sliding_log'.
-- ARGV[4]   granted_at: the reservation's time in microseconds (its now_us), on the same clock.
-- ARGV[5]   minimum key TTL in milliseconds (0 in production; tests on a manual clock raise it).
-- ARGV[6]   the expiry shift in ms (fixed_lib.lua's fixed_clock: 0 on Redis TIME).
-- ARGV[7 + 2(i-1)], ARGV[8 + 2(i-1)]  limit i's two numbers, as the decision script took them.
--
-- Returns 1 when this call settled the reservation, 0 when an earlier one had.

if not redis.call('SET', KEYS[#KEYS], '1', 'NX', 'PX', 3600000) then
  return 0
end
local now = now_us(ARGV[1])  -- from clock.lua, prepended
local delta = tonumber(ARGV[2])
local algorithm = ARGV[3]
local min_ttl = tonumber(ARGV[5])
fixed_clock(now, tonumber(ARGV[6]))  -- from fixed_lib.lua, prepended

local err = nil
if delta > 0 then
  err = debt_charge(#KEYS - 1, delta, algorithm, now, min_ttl)  -- from debt_lib.lua, prepended
elseif delta < 0 then
  local refunded = debt_refund(#KEYS - 1, -delta, algorithm, tonumber(ARGV[4]), now, min_ttl)
  if type(refunded) == 'table' then err = refunded end
end
if err then
  -- Nothing was settled: the marker goes, so that the settle can be sent again.
  redis.call('DEL', KEYS[#KEYS])
  return err
end
return 1
