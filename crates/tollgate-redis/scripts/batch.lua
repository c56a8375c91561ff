-- batch.lua: runs a batch of calls of one decision script in one EVALSHA (`Redis::batched`).
-- Not run alone: scripts.rs's `batched!` wraps a decision script's body (written for one call:
-- its KEYS, its ARGV, `return` its reply) as `local function decide_call(KEYS, ARGV)`, defines
-- its shape, and appends this file:
--   ARGS + ARGS_PER_KEY * (keys)    the arguments of a call,
--   REPLY + REPLY_PER_KEY * (keys)  the elements of its reply (a shorter reply is padded with 0).
--
-- KEYS   each call's keys, call after call.
-- ARGV   each call after the other: its key count, then its arguments.
-- Returns each call's reply, call after call. A call that fails (a key of another type:
-- WRONGTYPE) fails alone, as its own EVALSHA would: the decision scripts read before they write,
-- so it wrote nothing; its reply is the error's text (not an error reply: one inside the reply
-- would fail the whole run), then zeros.
--
-- Each call is decided alone, one after the other, as if each were its own EVALSHA: a call sees
-- what the calls before it took. What a run costs Redis apart from its calls (the command, the
-- script's start, reading TIME: clock.lua reads it once per run) is paid once per batch.

local answer, k, a = {}, 1, 1
while a <= #ARGV do
  local nkeys = tonumber(ARGV[a])
  local nargs, nreply = ARGS + ARGS_PER_KEY * nkeys, REPLY + REPLY_PER_KEY * nkeys
  local keys, args = {}, {}
  for i = 1, nkeys do keys[i] = KEYS[k + i - 1] end
  for i = 1, nargs do args[i] = ARGV[a + i] end
  local ok, reply = pcall(decide_call, keys, args)
  local n = #answer
  if ok then
    for i = 1, nreply do answer[n + i] = reply[i] or 0 end
  else
    if type(reply) == 'table' then reply = reply.err end  -- a table from Redis 7.2 on
    answer[n + 1] = tostring(reply)
    for i = 2, nreply do answer[n + i] = 0 end
  end
  k, a = k + nkeys, a + 1 + nargs
end
return answer
