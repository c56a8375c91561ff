-- batch.lua: runs a batch of calls of one decision script in one EVALSHA (`Redis::batched`).
-- Not run alone: scripts.rs's `batched!` wraps a decision script's body (written for one call:
-- its KEYS, its ARGV, `return` its reply) as `local function decide_call(KEYS, ARGV)`, defines
-- its shape, and appends this file:
--   ARGS + ARGS_PER_KEY * (keys)    the arguments of a call,
--   REPLY + REPLY_PER_KEY * (keys)  the elements of its reply at most (in a batch, a shorter one
--                                   is padded with 0; a call alone replies as its body does).
--
-- KEYS   each call's keys, call after call.
-- ARGV   each call's arguments, call after call; then, for more than one call, each call's key
--        count; last, the number of calls. A call alone sees its KEYS and ARGV as they are (the
--        '1' after its arguments is read by no script), and runs with nothing around it.
-- Returns the reply of a call alone as it is (its error, if it fails); for a batch, each call's
-- reply, call after call. In a batch, a call that fails (a key of another type: WRONGTYPE) fails
-- alone, as its own EVALSHA would: the decision scripts read every key before they count on any
-- (sliding_log.lua drops a key's expired entries first: no count changes), so it counted
-- nothing; its reply is the error's text (not an error reply: one inside the reply would fail
-- the whole run), then zeros.
--
-- Each call is decided alone, one after the other, as if each were its own EVALSHA: a call sees
-- what the calls before it took. What a run costs Redis apart from its calls (the command, the
-- script's start, reading TIME: clock.lua reads it once per run) is paid once per batch.

local calls = ARGV[#ARGV]
if calls == '1' then return decide_call(KEYS, ARGV) end  -- compared as text: a tonumber is a strtod
calls = tonumber(calls)
local answer, k, a, counts = {}, 1, 1, #ARGV - calls - 1
for c = 1, calls do
  local nkeys = tonumber(ARGV[counts + c])
  local nargs, nreply = ARGS + ARGS_PER_KEY * nkeys, REPLY + REPLY_PER_KEY * nkeys
  -- Built whole (a table filled one element at a time grows, and rehashes, at each power of 2).
  local keys, args = {unpack(KEYS, k, k + nkeys - 1)}, {unpack(ARGV, a, a + nargs - 1)}
  local ok, reply = pcall(decide_call, keys, args)
  local n = #answer
  if ok then
    for i = 1, nreply do answer[n + i] = reply[i] or 0 end
  else
    if type(reply) == 'table' then reply = reply.err end  -- a table from Redis 7.2 on
    answer[n + 1] = tostring(reply)
    for i = 2, nreply do answer[n + i] = 0 end
  end
  k, a = k + nkeys, a + nargs
end
return answer
