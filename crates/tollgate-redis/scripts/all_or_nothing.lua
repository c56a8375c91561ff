-- all_or_nothing.lua: how every script that decides several keys together decides, written once.
-- Not run alone: it is prepended (after clock.lua and fixed_lib.lua) to token_bucket.lua,
-- fixed_window.lua, weighted_window.lua, sliding_log.lua and counters.lua, so each call is still
-- one EVALSHA. The rule is the Rust side's `tollgate::AllOrNothing`: the call is admitted when
-- every enforcing part has room (a part that only counts never denies); then every part with room
-- takes, else none does (a script decides under Redis's lock, so nothing is taken to be given
-- back).
--
-- PARTS[i] or part(i, {field = value, ...}) -> the table of the call's part i (of its i-th key):
--   the script sets its fields, `fits` (part i alone has room) and `enforce` (false for a part
--   that only counts; nil enforces) among them. The tables are kept across the calls of a run (a
--   table per part is an allocation; a field set again is not), made once with a constructor
--   naming every field the script sets (one filled field by field grows, and rehashes, at each
--   power of 2); `or` makes it only when PARTS[i] is nil. A script sets every field it reads,
--   for each part.
-- decide(n) -> admitted (0|1), limiting
--   Over parts 1..n: limiting is the first enforcing part without room (1-based; 0 when
--   admitted).
-- fresh_meta() -> meta
--   The call's metadata, empty ({reset = 0, retry = 0}): one table kept across the calls of a
--   run, emptied for each (a table per call is an allocation).
-- tighter(meta, limit, remaining, reset, retry)
--   Folds a part's metadata into meta: the smallest remaining (and its limit), the latest reset
--   and the longest retry.
-- reply(r, admitted, meta, now, wait)
--   Writes the limiter scripts' reply at answer[r + 1 ..] (batch.lua):
--   {admitted (0|1), limit, remaining, reset_us, retry_us, now_us (the decision's time)[, wait_us]},
--   wait_us left 0 when there is none.
--
-- Cost: these take what they need as arguments and make no closures: a closure that captures the
-- script's locals (a callback per call) costs an allocation per local and the collector's time,
-- a tenth of a small script's instructions (`.ci/redis-instructions`).

local PARTS = {}

local function part(i, new)
  PARTS[i] = new
  return new
end

local function decide(n)
  for i = 1, n do
    local p = PARTS[i]
    if not p.fits and p.enforce ~= false then return 0, i end
  end
  return 1, 0
end

local META = {limit = 0, remaining = 0, reset = 0, retry = 0}
local function fresh_meta()
  META.limit, META.remaining, META.reset, META.retry = nil, nil, 0, 0
  return META
end

local function tighter(meta, limit, remaining, reset, retry)
  if meta.remaining == nil or remaining < meta.remaining then
    meta.remaining, meta.limit = remaining, limit
  end
  if reset > meta.reset then meta.reset = reset end
  if retry > meta.retry then meta.retry = retry end
end

local function reply(r, admitted, meta, now, wait)
  answer[r + 1], answer[r + 2], answer[r + 3] = admitted, meta.limit, meta.remaining
  answer[r + 4], answer[r + 5], answer[r + 6] = meta.reset, meta.retry, now
  if wait > 0 then answer[r + 7] = wait end
end
