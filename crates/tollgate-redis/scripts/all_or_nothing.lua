-- all_or_nothing.lua: how every script that decides several keys together decides, written once.
-- Not run alone: it is prepended (after clock.lua and window_lib.lua) to token_bucket.lua,
-- fixed_window.lua, weighted_window.lua, sliding_log.lua and counters.lua, so each call is still
-- one EVALSHA. The rule is the Rust side's `tollgate::AllOrNothing`: the call is admitted when
-- every enforcing part has room (a part that only counts never denies); then every part with room
-- takes, else none does (a script decides under Redis's lock, so nothing is taken to be given
-- back).
--
-- read_parts(read) -> parts, admitted (0|1), limiting
--   Calls read(i, key) for each of KEYS in order; it returns part i as a table with `fits` (part i
--   alone has room) and `enforce` (false for a part that only counts; nil enforces). limiting is
--   the first enforcing part without room (1-based; 0 when admitted).
-- tightest() -> t
--   The parts' metadata folded into one: t.add(limit, remaining, reset, retry) keeps the smallest
--   remaining (and its limit), the latest reset and the longest retry, read back as t.limit,
--   t.remaining, t.reset, t.retry.
--
-- The four scripts of RedisLimiter (token_bucket, fixed_window, weighted_window, sliding_log) take
-- one ARGV layout and give one reply; both are here, and each script says how its parts are read
-- and settled:
-- limiter_args() -> now, n, mode, max_wait, min_ttl
--   ARGV[1] (now in µs, or '' for the server's TIME, by clock.lua's now_us) to ARGV[5].
-- decide(now, n, mode, read, settle) -> {admitted, limit, remaining, reset, retry, wait, limiting, now}
--   read(key, a, b) -> part i, from KEYS[i] and its two numbers ARGV[6 + 2(i-1)], ARGV[7 + 2(i-1)]
--   (as read_parts wants it). The call takes when admitted, n > 0 and mode ~= 0; then, in order,
--   settle(key, part, take, limiting) writes part i if `take` and returns the state it is left in:
--   limit, remaining, reset, retry, and the µs until the taken slot (nil = 0); `limiting` says part
--   i is the one that denied. The reply folds them by tightest() (wait: the longest).

local function read_parts(read)
  local parts, admitted, limiting = {}, 1, 0
  for i, key in ipairs(KEYS) do
    local part = read(i, key)
    parts[i] = part
    if admitted == 1 and not part.fits and part.enforce ~= false then
      admitted, limiting = 0, i
    end
  end
  return parts, admitted, limiting
end

local function tightest()
  local t = {limit = nil, remaining = nil, reset = 0, retry = 0}
  function t.add(limit, remaining, reset, retry)
    if t.remaining == nil or remaining < t.remaining then
      t.remaining, t.limit = remaining, limit
    end
    if reset > t.reset then t.reset = reset end
    if retry > t.retry then t.retry = retry end
  end
  return t
end


local function limiter_args()
  return now_us(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
end

local function decide(now, n, mode, read, settle)
  local parts, admitted, limiting = read_parts(function(i, key)
    return read(key, tonumber(ARGV[6 + 2 * (i - 1)]), tonumber(ARGV[7 + 2 * (i - 1)]))
  end)
  local take = admitted == 1 and n > 0 and mode ~= 0
  local meta, wait = tightest(), 0
  for i, key in ipairs(KEYS) do
    local limit, remaining, reset, retry, slot = settle(key, parts[i], take, i == limiting)
    meta.add(limit, remaining, reset, retry)
    wait = math.max(wait, slot or 0)
  end
  return {admitted, meta.limit, meta.remaining, meta.reset, meta.retry, wait, limiting, now}
end
