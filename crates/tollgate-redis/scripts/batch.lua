-- batch.lua: runs a batch of calls of one decision script in one EVALSHA (`Redis::batched`).
-- Not run alone: scripts.rs's `batched!` assembles clock.lua, run.lua (NOW, MIN_TTL and `answer`,
-- the reply being built), the libraries, the script's body wrapped as
-- `local function decide_call(k, a, nkeys)`, its shape, and this file last:
--   ARGS + ARGS_PER_KEY * nkeys    the arguments of a call,
--   REPLY + REPLY_PER_KEY * nkeys  the elements of its reply at most (in a batch, a shorter one
--                                  is padded with 0; a call alone replies as its body does).
-- decide_call decides one call: its keys are KEYS[k .. k + nkeys - 1], its arguments ARGV[a ..];
-- it appends its reply to `answer`. Offsets, not slices: a table per call built and a reply
-- copied cost about 9,000 instructions a call (`.ci/redis-instructions`).
--
-- KEYS   each call's keys, call after call.
-- ARGV   each call's arguments, call after call; then, for more than one call, each call's key
--        count; then now and the minimum key TTL (run.lua); last, the number of calls.
-- Returns the reply of a call alone as its body built it (its error, if it fails, is the run's);
-- for a batch, each call's reply, call after call. In a batch, a call that fails (a key of
-- another type: WRONGTYPE) fails alone, as its own EVALSHA would: the decision scripts read
-- every key before they count on any (sliding_log.lua drops a key's expired entries first: no
-- count changes), so it counted nothing; its reply is the error's text (not an error reply: one
-- inside the reply would fail the whole run), then zeros.
--
-- Each call is decided alone, one after the other, as if each were its own EVALSHA: a call sees
-- what the calls before it took. What a run costs Redis apart from its calls (the command, the
-- script's start, reading TIME, the clock's arguments: run.lua) is paid once per batch.

local calls = ARGV[#ARGV]
if calls == '1' then  -- compared as text: a conversion is a strtod
  decide_call(1, 1, #KEYS)
  return answer
end
calls = calls + 0
local k, a, counts = 1, 1, #ARGV - calls - 3
for c = 1, calls do
  local nkeys = ARGV[counts + c] + 0
  local n = #answer
  local last = n + REPLY + REPLY_PER_KEY * nkeys
  local ok, err = pcall(decide_call, k, a, nkeys)
  if not ok then
    for i = #answer, n + 1, -1 do answer[i] = nil end  -- what the call appended before it failed
    if type(err) == 'table' then err = err.err end  -- a table from Redis 7.2 on
    answer[n + 1] = tostring(err)
  end
  for i = #answer + 1, last do answer[i] = 0 end
  k, a = k + nkeys, a + ARGS + ARGS_PER_KEY * nkeys
end
return answer
