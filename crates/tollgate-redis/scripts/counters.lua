-- counters.lua: the rate-limit server's counters: fixed windows of different limits decided
-- together, reporting every counter (Envoy wants a status per descriptor). A window opens at the
-- first hit after the previous one ended (as Limitador, and as tollgate's FixedWindow).
--
-- One run decides a batch of calls, one after the other, each alone (as if each were its own
-- EVALSHA: a call sees what the calls before it took). What a run costs Redis apart from its
-- calls (the command, the script's start, reading TIME) is paid once per batch.
--
-- KEYS      each call's counters, call after call: a hash {s = window start (µs), c = count}.
--           On a cluster, the keys of one run share a hash tag.
-- ARGV      each call after the other, 4 + 7 per counter:
--   now     in microseconds, or '' to read the server's TIME (read once per run).
--   mode    0 = check (take nothing), 1 = check and take: every counter takes its hits if they
--           fit in every enforcing counter, else none does (a counter that does not enforce
--           takes its hits only if they fit),
--           2 = report: each counter takes its hits if they fit, on its own;
--           3 = flush: each counter takes its hits, or what is left of its limit if less (a
--               cache's hits that were already allowed, counted as far as the window can hold them).
--   min_ttl minimum key TTL in milliseconds (0 in production; tests on a manual clock raise it).
--   n       the call's counters, each 7 ARGV:
--     limit    (max_value).
--     window   in microseconds.
--     hits     (0 = probe).
--     role     1 = enforcing, 0 = never denies (a shadow or quota limit),
--              2 = charged: never denies, and mode 1 takes its hits (or what is left of its limit
--              if less) whatever the call's outcome (a limit that counts every hit past itself;
--              its limit is then what it can hold),
--              'p' and a number = pooled: charged as 2, and over when its count (after the call's
--              hits) passes that number; when every pooled counter of the call is over, the call
--              is not admitted (envoy/ratelimit's quota_mode).
--     start    a calendar window's start in microseconds on the same clock as now (0 for a window
--              opened by the first hit).
--     end      that calendar window's end; 0 for a window opened by the first hit. A counter
--              stored for another start is from another window: it starts at 0.
--     ago      for a window opened by the first hit, how long ago (µs) the caller saw that hit (a
--              cache flushing the hits it allowed): a window not stored yet starts then rather
--              than now, so that it is the caller's. Below the window's length; 0 otherwise.
--
-- Returns, call after call: admitted (0|1) (or the text of the call's error), then for each counter: remaining, reset_us, counters
-- as they are after the call; remaining is -(remaining + 1) when that counter alone had no room
-- (in modes 0 and 1), enforcing or not: a small reply, as Redis converts each element. A key
-- lives until its window ends; a window's start is written when it opens, then only its count
-- moves (HINCRBY).
--
-- Cost: the fields a decision does not need are not converted (a calendar's and `ago` are
-- compared with '0' first), and an open window takes one HMGET and one HINCRBY
-- (`.ci/redis-instructions counters`).

local redis_now = nil  -- TIME, read by the first call that needs it

-- decide_call(k, a, n, answer): decides the call of n counters whose keys start at KEYS[k] and
-- whose arguments start at ARGV[a], and appends its answer to `answer`.
local function decide_call(k, a, n, answer)
  local now = ARGV[a]
  if now == '' then
    if redis_now == nil then redis_now = now_us('') end  -- from clock.lua, prepended
    now = redis_now
  else
    now = tonumber(now)
  end
  local mode = ARGV[a + 1]
  local min_ttl = nil  -- read where used: each tonumber is a strtod

  -- Does every enforcing counter admit? (decide: from all_or_nothing.lua, prepended)
  local any_pooled = false
  local windows = {}
  for i = 1, n do
    local key, at = KEYS[k + i - 1], a + 4 + 7 * (i - 1)
    local lim, period, hits = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    local role = ARGV[at + 3]
    local enforce, charge, pooled = role == '1', role == '2', nil
    if not enforce and not charge and role ~= '0' then
      pooled, charge, any_pooled = tonumber(string.sub(role, 2)), true, true
    end
    -- fixed_state, fixed_store: from window_lib.lua, prepended
    local calendar, start, count, open = ARGV[at + 5] ~= '0', nil, nil, nil
    if calendar then
      local astart = tonumber(ARGV[at + 4])
      start, count, open = fixed_state(key, period, now, astart)
      period = tonumber(ARGV[at + 5]) - astart
    else
      start, count, open = fixed_state(key, period, now)
      if not open and ARGV[at + 6] ~= '0' then start = math.max(now - math.min(tonumber(ARGV[at + 6]), period - 1), 0) end
    end
    windows[i] = {start = start, count = count, lim = lim, period = period, hits = hits, enforce = enforce,
                  charge = charge, pooled = pooled, open = open, calendar = calendar,
                  fits = mode == '3' or count + hits <= lim}
  end
  local admitted = decide(windows)
  -- Pooled counters: the call is not admitted when every one is over with its hits.
  if any_pooled then
    local under = false
    for _, w in ipairs(windows) do
      if w.pooled and w.count + w.hits <= w.pooled then under = true end
    end
    if not under then admitted = 0 end
  end

  answer[#answer + 1] = admitted
  for i = 1, n do
    local w = windows[i]
    if w.hits > 0 and ((mode == '1' and ((admitted == 1 and w.fits) or w.charge)) or (mode == '2' and w.fits) or mode == '3') then
      local count = w.count
      if count + w.hits <= w.lim then count = count + w.hits elseif w.lim > count then count = w.lim end
      if not w.open then min_ttl = min_ttl or tonumber(ARGV[a + 2]) end
      local ttl = not w.open and math.max(math.ceil((w.start + w.period - now) / 1000), 1, min_ttl)
      fixed_store(KEYS[k + i - 1], w, count, ttl)
      w.count = count
    end
    local reset = 0
    if w.count > 0 or w.calendar then reset = math.max(w.start + w.period - now, 0) end
    local remaining = math.max(w.lim - w.count, 0)
    if not w.fits and (mode == '0' or mode == '1') then remaining = -remaining - 1 end
    answer[#answer + 1] = remaining
    answer[#answer + 1] = reset
  end
end

-- A call that fails (a key of another type: WRONGTYPE) fails alone, as its own EVALSHA would: its
-- reads come before its writes, so it has written nothing; its answer is the error, then zeros.
local answer, k, a = {}, 1, 1
while a <= #ARGV do
  local n, mark = tonumber(ARGV[a + 3]), #answer
  local ok, err = pcall(decide_call, k, a, n, answer)
  if not ok then
    for i = #answer, mark + 1, -1 do answer[i] = nil end
    if type(err) == 'table' then err = err.err end  -- a table from Redis 7.2 on
    answer[mark + 1] = tostring(err)  -- text: an error reply inside the reply would fail the whole run
    for i = 1, 2 * n do answer[mark + 1 + i] = 0 end
  end
  k, a = k + n, a + 4 + 7 * n
end
return answer
