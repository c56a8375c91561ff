-- clock.lua: prepended to every limiter script (one EVALSHA still runs one script).
--
-- now_us(arg): the time in microseconds: `arg` when the caller passed one (tests on a manual
-- clock), otherwise the server's TIME (never the client's clock), read once per run: every call
-- of a batch (batch.lua) is decided at the same time.
local time_us = nil  -- TIME, read once per run (a run of batch.lua decides several calls)
local function now_us(arg)
  if arg ~= '' then
    return tonumber(arg)
  end
  if time_us == nil then
    local t = redis.call('TIME')
    time_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return time_us
end
