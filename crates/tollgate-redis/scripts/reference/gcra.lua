-- reference/gcra.lua: the least work a token-bucket (GCRA) decision of one key needs on Redis,
-- on Redis's clock, to measure tollgate's token_bucket.lua against (`.ci/redis-instructions`).
-- Not used by any limiter: one bucket, no metadata beyond admitted.
--
-- KEYS[1]  the bucket's theoretical arrival time (µs, a string).
-- ARGV[1]  hits; ARGV[2] µs per token (the emission interval); ARGV[3] burst tolerance in µs
--          (capacity × interval); ARGV[4] now in µs, or '' for Redis TIME (as tollgate's scripts
--          take it: a fixed time makes every call of a measurement the same work).
-- Returns 1 when the hits fitted (and were taken), else 0.
local now = tonumber(ARGV[4])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local tat = math.max(tonumber(redis.call('GET', KEYS[1])) or now, now)
local new = tat + ARGV[1] * ARGV[2]
if new - now > tonumber(ARGV[3]) then return 0 end
redis.call('SET', KEYS[1], string.format('%.0f', new), 'PX', math.ceil((new - now) / 1000))
return 1
