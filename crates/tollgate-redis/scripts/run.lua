-- run.lua: what the calls of a run of a decision script share (scripts.rs's `batched!` puts it
-- after clock.lua, before the libraries and the script's body; batch.lua's `run` runs the calls).
-- The script is a Redis function (FCALL, loaded once: its functions and tables are made once,
-- not at every run) or, where functions cannot be used, an EVALSHA script: the state below is
-- set again at the start of every run (`start_run`), never carried from one run to the next.
--
-- ARGV ends with: ..., on the caller's clock (tests on a manual clock) its three words: now (µs),
-- the minimum key TTL (ms) and the expiry shift (ms: fixed_lib.lua's fixed_clock); then the
-- number of calls, negative when those three words are there. On Redis TIME they are not sent
-- (TIME, 0 and 0): every argument costs Redis about 1,200 instructions, a tenth of a call
-- alone. They are the run's (`Redis::batched` runs only calls of one clock together), so each
-- is sent and converted once per run, not per call.
--
-- KEYS, ARGV the run's (locals: a global is a lookup in Redis's protected globals table, and a
--           function has none).
-- NOW       the time every call of the run is decided at.
-- MIN_TTL   the minimum key TTL (ms).
-- SHIFT     the expiry shift (ms), as text: fixed_lib.lua converts it on a passed-in clock
--           only (a 14-digit number is a strtod of about 2,000 instructions).
-- RUN       counts the runs of this script: what a library works out once a run from the
--           above (fixed_lib.lua's fixed_clock) is kept with the run it was made in.
-- answer    the run's reply: each call writes its elements at its offset (batch.lua).
local KEYS, ARGV, answer, NOW, MIN_TTL, SHIFT, RUN = nil, nil, nil, nil, nil, nil, 0

-- start_run(keys, args) -> calls, tail: the number of calls, and how many words end ARGV after
-- the run's reply length (batch.lua): the clock's, if sent, and the number of calls.
local function start_run(keys, args)
  KEYS, ARGV, RUN = keys, args, RUN + 1
  time_us, clock_passed = nil, false  -- clock.lua's: each run reads its own TIME
  local calls = args[#args]
  if calls == '1' then  -- one call on Redis TIME, compared as text: a conversion is a strtod
    NOW, MIN_TTL, SHIFT = now_us(''), 0, '0'
    return 1, 1
  end
  calls = calls + 0
  if calls > 0 then
    NOW, MIN_TTL, SHIFT = now_us(''), 0, '0'
    return calls, 1
  end
  NOW, MIN_TTL, SHIFT = now_us(args[#args - 3]), args[#args - 2] + 0, args[#args - 1]
  return -calls, 4
end
