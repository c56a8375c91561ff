-- run.lua: what the calls of a run of a decision script share (scripts.rs's `batched!` puts it
-- after clock.lua, before the libraries and the script's body; batch.lua runs the calls).
--
-- ARGV ends with: ..., now (µs, or '' for Redis TIME: clock.lua), the minimum key TTL in
-- milliseconds (0 in production; tests on a manual clock raise it), the expiry shift in ms
-- (fixed_lib.lua's fixed_clock: 0 on Redis TIME), the number of calls. They
-- are the caller's clock's (`Redis::batched` runs only calls of one clock together), so each is
-- sent and converted once per run, not per call: every argument costs Redis about 800
-- instructions.
--
-- NOW       the time every call of the run is decided at.
-- MIN_TTL   the minimum key TTL (ms).
-- SHIFT     the expiry shift (ms), as text: fixed_lib.lua converts it on a passed-in clock
--           only (a 14-digit number is a strtod of about 2,000 instructions).
-- answer    the run's reply: each call writes its elements at its offset (batch.lua).
-- KEYS and ARGV as locals: a global is a lookup in Redis's protected globals table.
local KEYS, ARGV, answer = KEYS, ARGV, nil  -- answer: made at its size by batch.lua
local NOW, MIN_TTL, SHIFT = now_us(ARGV[#ARGV - 3]), ARGV[#ARGV - 2] + 0, ARGV[#ARGV - 1]
