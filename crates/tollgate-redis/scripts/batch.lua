-- batch.lua: `run`, which runs a batch of calls of one decision script in one FCALL (or EVALSHA:
-- `Redis::batched`). Not run alone: scripts.rs's `batched!` assembles clock.lua, run.lua (NOW,
-- MIN_TTL and `answer`, the reply being built), the libraries, the script's body wrapped as
-- `local function decide_call(k, a, nkeys, r)`, its shape, and this file last, then registers
-- `run` as a function or calls it (`Batched::new`):
--   ARGS + ARGS_PER_KEY * nkeys    the arguments of a call,
--   REPLY + REPLY_PER_KEY * nkeys  the elements of its reply at most (in a batch, a shorter one
--                                  is padded with 0; a call alone replies as its body does).
-- decide_call decides one call: its keys are KEYS[k .. k + nkeys - 1], its arguments ARGV[a ..];
-- it writes its reply at answer[r + 1 ..] (what it leaves unwritten is 0). Offsets, not slices: a
-- table per call built and a reply copied cost about 9,000 instructions a call
-- (`.ci/redis-instructions`); the reply is made whole at its final size, as a table filled one
-- element at a time grows, and rehashes, at each power of 2 (about 6,000 instructions for a call
-- alone).
--
-- KEYS   each call's keys, call after call.
-- ARGV   each call's arguments, call after call; then, for more than one call, each call's key
--        count and the run's reply length (the sum of the calls' REPLY + REPLY_PER_KEY * nkeys:
--        the client knows it, and each key count is then converted once, not twice: about 600
--        instructions a call); then the clock's words on a passed-in clock, and the number of
--        calls (run.lua).
-- Returns each call's reply, call after call, each REPLY + REPLY_PER_KEY * nkeys elements (0 where
-- the call wrote nothing), packed in one string (`packed` below: 8 bytes an integer), or as a
-- table when a call failed or there are more than 4,000; a call alone's error, if it fails, is the
-- run's. In a batch, a call that fails (a key of another type: WRONGTYPE) fails alone, as its
-- own run would: the decision scripts read
-- every key before they count on any (sliding_log.lua drops a key's expired entries first: no
-- count changes), so it counted nothing; its reply is the error's text (not an error reply: one
-- inside the reply would fail the whole run), then zeros.
--
-- Each call is decided alone, one after the other, as if each were its own EVALSHA: a call sees
-- what the calls before it took. What a run costs Redis apart from its calls (the command, the
-- function's start, reading TIME, the clock's arguments: run.lua) is paid once per batch.

-- n zeros, in one table constructor (string.byte returns them all at once; it is bounded by Lua's
-- C stack, so a reply longer than 4,000 elements is filled one element at a time).
local function zeros(n)
  if n <= 4000 then return {string.byte(string.rep('\0', n), 1, n)} end
  local t = {}
  for i = 1, n do t[i] = 0 end
  return t
end

-- The reply table of a call alone, by its length (up to 64 elements: 30 keys of a counter): a
-- function keeps it from run to run and zeroes it, instead of making one (about 2,000
-- instructions for 7 elements). `packed` copies it into the reply.
local ALONE = {}

-- The reply's integers packed in one string, 8 bytes each, little-endian (`i8`, not `l`: the
-- size of C's long is the platform's): Redis writes a table element by element, and the client
-- parses each element; a string is one element (its integers as RESP's would be: a fraction
-- dropped). Up to 4,000 integers (unpack is bounded by Lua's C stack, as string.byte is); a
-- longer reply is the table.
-- Each length's format is made once (FORMATS: a function keeps it from run to run; about 2,000
-- instructions made anew).
local FORMATS = {}
local function packed(t, n)
  if n > 4000 then return t end
  local format = FORMATS[n]
  if not format then
    format = '<' .. string.rep('i8', n)
    FORMATS[n] = format
  end
  return struct.pack(format, unpack(t, 1, n))
end

-- The run: KEYS and ARGV as EVALSHA's or FCALL's (scripts.rs adds the line that calls it).
local function run(keys, args)
  local calls, tail = start_run(keys, args)  -- run.lua
  if calls == 1 then
    local n = REPLY + REPLY_PER_KEY * #KEYS
    answer = ALONE[n]
    if answer then
      for i = 1, n do answer[i] = 0 end
    else
      answer = zeros(n)
      if n <= 64 then ALONE[n] = answer end
    end
    decide_call(1, 1, #KEYS, 0)
    return packed(answer, n)
  end
  local counts = #ARGV - tail - 1 - calls
  local total = ARGV[#ARGV - tail] + 0
  answer = zeros(total)
  local failed = false
  local k, a, r = 1, 1, 0
  for c = 1, calls do
    local nkeys = ARGV[counts + c] + 0
    local last = r + REPLY + REPLY_PER_KEY * nkeys
    local ok, err = pcall(decide_call, k, a, nkeys, r)
    if not ok then
      if type(err) == 'table' then err = err.err end  -- a table from Redis 7.2 on
      answer[r + 1] = tostring(err)
      failed = true
      for i = r + 2, last do answer[i] = 0 end  -- what the call wrote before it failed
    end
    k, a, r = k + nkeys, a + ARGS + ARGS_PER_KEY * nkeys, last
  end
  if failed then return answer end  -- a call's error is text: the table
  return packed(answer, total)
end
