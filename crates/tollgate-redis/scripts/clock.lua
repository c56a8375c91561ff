-- clock.lua: prepended to every limiter script (one EVALSHA still runs one script).
--
-- now_us(arg): the time in microseconds: `arg` when the caller passed one (tests on a manual
-- clock), otherwise the server's TIME (never the client's clock), read once per run: every call
-- of a batch (batch.lua) is decided at the same time. `clock_passed` says which it was.
--
-- Numbers that are always there are converted by arithmetic (`arg + 0`), here and in the scripts:
-- Lua 5.1's `tonumber` converts its argument twice (it asks whether it is a number, then
-- converts), about 2,000 instructions for a 13-digit number against 900. `tonumber` is kept where
-- the value may be missing (it answers nil where arithmetic raises).
local time_us = nil  -- TIME, read once per run (a run of batch.lua decides several calls)
local clock_passed = false  -- the caller's clock (now_us was given a time), not Redis's
local function now_us(arg)
  if arg ~= '' then
    clock_passed = true
    return arg + 0
  end
  if time_us == nil then
    local t = redis.call('TIME')
    time_us = t[1] * 1000000 + t[2]
  end
  return time_us
end

-- ceil(x): x rounded up to a whole number, by arithmetic (math.ceil, a library call, costs about
-- 700 instructions).
local function ceil(x)
  local whole = x - x % 1
  if whole < x then return whole + 1 end
  return whole
end
