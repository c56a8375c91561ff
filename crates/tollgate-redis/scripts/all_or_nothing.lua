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

