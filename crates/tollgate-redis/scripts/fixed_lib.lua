-- fixed_lib.lua: a fixed window's stored state, read and counted as of `now`. Not run alone: it is
-- prepended (after clock.lua, and run.lua in a batched script) to the scripts that keep fixed
-- windows, so each call is still one EVALSHA. Each function here is a closure every run of a
-- script makes (about 400 instructions), so a script includes only the libraries it uses.
--
-- A fixed window is a string key holding its count, which expires when the window ends: an
-- open window is counted by one INCRBY and read by one PTTL (integer replies: nothing to
-- convert), and Redis drops a window when it ends. A key written by an earlier tollgate (a hash
-- {s = start, c = count}) is rewritten in this form the first time it is touched.
--
-- fixed_clock(now, shift, run)
--   Sets how a key's expiry maps to a window's end, for a run's fixed_* calls (FIXED_RUN is
--   `run` after it, run.lua's RUN in a batched script: a function keeps these across its runs,
--   so each run sets them again): on Redis TIME (clock.lua: not clock_passed) the key expires at its
--   end, set and read relative to now (PEXPIRE, PTTL); on the caller's clock (tests on a manual
--   clock) it expires `shift` ms after its end on that clock, set and read as instants
--   (PEXPIREAT, PEXPIRETIME: Redis 7), so ends come back exactly whatever Redis's own clock did
--   meanwhile. `shift` (ms, a number or its text) places the caller's clock on Redis's, with
--   room to spare (`RedisTime`'s expiry shift); 0 on Redis TIME.
-- fixed_take(key, text, n, opens, after, period) -> count, ends, new
--   Counts n (`text`: n as the caller sent it, so no number is formatted) in the key's window:
--   the one open (it ends after `after`: now, or a calendar window's start if later), or (none
--   open) one opening now that ends at `opens` (µs; nil: `after + period`); `period` is the
--   window's length, a number or its text (converted only when a window opens, or an earlier
--   layout's key is read). Returns the count after, the window's end, and whether
--   the window is new (then the key did not hold it before); nil and the error for a key that
--   holds no count (another type, or text), which is left as it was. Taken before the call is
--   decided: fixed_untake gives it back.
-- fixed_untake(key, text, new)
--   Gives back what fixed_take counted: deletes a new window, or counts `text` back.
-- fixed_trim(key, by)
--   Counts `by` (a number) back of what fixed_take counted, leaving some.
-- fixed_end(key) -> ends
--   When the key's window ends (µs on the decision clock; before any now for a key without
--   expiry).
-- fixed_read(key, after, period) -> count, ends
--   The open window's count and end (0 and nil when none is open), nothing written; nil and the
--   error for a key that holds no count.
-- fixed_fail(parts, upto, err)
--   Gives back what parts 1..upto took (a part's fields: key, text, new, taken), then raises
--   err: a call that fails counts nothing (batch.lua).
-- fixed_part(parts, i, key, taken, text, n, opens, after, period) -> before, ends, new
--   Part i of a call (parts: all_or_nothing.lua's PARTS, those before i filled): fixed_take when
--   `taken`, else fixed_read. The count before the call's n, the window's end (when none is
--   open, where one opening now would end) and whether fixed_take opened it; a key that holds no
--   count fails the call (fixed_fail).

local FIXED_E0, FIXED_SHIFT, FIXED_TTL, FIXED_EXPIRE, FIXED_RUN = nil, nil, nil, nil, nil  -- fixed_clock's
local function fixed_clock(now, shift, run)
  FIXED_RUN = run
  if clock_passed then  -- from clock.lua, prepended
    FIXED_E0, FIXED_SHIFT, FIXED_TTL, FIXED_EXPIRE = 0, shift + 0, 'PEXPIRETIME', 'PEXPIREAT'
  else
    FIXED_E0, FIXED_SHIFT, FIXED_TTL, FIXED_EXPIRE = now, 0, 'PTTL', 'PEXPIRE'
  end
end

-- The expiry argument of a window that ends at `ends` (µs): ms from now, or the instant, rounded
-- up, at least 1 ms on.
local function fixed_expiry(ends)
  local ms = ceil((ends - FIXED_E0) / 1000)  -- from clock.lua, prepended
  if ms < 1 and not clock_passed then ms = 1 end
  return ms + FIXED_SHIFT
end

-- A key of an earlier tollgate's layout (a hash), rewritten as a string that holds its open
-- window's count until its end (or deleted, its window over). False for a key of another type.
local function fixed_migrate(key, after, period)
  if redis.call('TYPE', key).ok ~= 'hash' then return false end
  local stored = redis.call('HMGET', key, 's', 'c')
  local start, count = tonumber(stored[1]), tonumber(stored[2]) or 0
  redis.call('DEL', key)
  if start and count > 0 and after < start + period then
    redis.call('SET', key, count)
    redis.call(FIXED_EXPIRE, key, fixed_expiry(start + period))
  end
  return true
end

local function fixed_end(key)
  return FIXED_E0 + (redis.call(FIXED_TTL, key) - FIXED_SHIFT) * 1000
end

local function fixed_take(key, text, n, opens, after, period)
  local count = redis.pcall('INCRBY', key, text)
  if type(count) == 'table' then  -- WRONGTYPE (an earlier layout's hash?), or not a number
    if not fixed_migrate(key, after, period) then return nil, count end
    count = redis.call('INCRBY', key, text)
  end
  if count ~= n then
    local ends = fixed_end(key)
    -- Over (on the caller's clock Redis keeps a key past its end), or no expiry (not ours).
    if ends > after then return count, ends, false end
    redis.call('SET', key, text)
  end
  opens = opens or after + period
  redis.call(FIXED_EXPIRE, key, fixed_expiry(opens))
  return n, opens, true
end

local function fixed_untake(key, text, new)
  if new then
    redis.call('DEL', key)
  else
    redis.call('DECRBY', key, text)
  end
end

local function fixed_trim(key, by)
  redis.call('DECRBY', key, by)
end

local function fixed_read(key, after, period)
  local count = redis.pcall('GET', key)
  if type(count) == 'table' then
    if not fixed_migrate(key, after, period) then return nil, count end
    count = redis.call('GET', key)
  end
  if not count then return 0, nil end
  count = tonumber(count)
  if not count then return nil, {err = 'ERR value is not an integer or out of range'} end
  local ends = fixed_end(key)
  if ends <= after then return 0, nil end
  return count, ends
end

local function fixed_fail(parts, upto, err)
  for j = 1, upto do
    local p = parts[j]
    if p.taken then fixed_untake(p.key, p.text, p.new) end
  end
  error(err)
end

local function fixed_part(parts, i, key, taken, text, n, opens, after, period)
  if taken then
    local count, ends, new = fixed_take(key, text, n, opens, after, period)
    if not count then fixed_fail(parts, i - 1, ends) end
    return count - n, ends, new
  end
  local count, ends = fixed_read(key, after, period)
  if not count then fixed_fail(parts, i - 1, ends) end
  return count, ends or opens or after + period, false
end
