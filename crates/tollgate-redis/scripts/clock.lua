-- clock.lua: prepended to every limiter script (one EVALSHA still runs one script).
--
-- now_us(arg): the time in microseconds: `arg` when the caller passed one (tests on a manual
-- clock), otherwise the server's TIME (never the client's clock).
local function now_us(arg)
  if arg ~= '' then
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

