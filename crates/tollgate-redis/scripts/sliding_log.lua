-- sliding_log.lua: exact sliding logs (one sorted-set member per permit, scored by the time it
-- was taken), one or more decided together, all-or-nothing. Never more than `limit` permits in
-- any window of `period`.
-- Written for one call, at offsets into the run's KEYS and ARGV (batch.lua wraps it as
-- decide_call(k, a, nkeys, r), scripts.rs's `batched!`): its KEYS[i] below is KEYS[k + i - 1], its
-- ARGV[j] is ARGV[a + j - 1]; it writes its reply at answer[r + 1 ..]. The time (NOW, on the server's TIME
-- or the caller's clock) and the minimum key TTL (MIN_TTL, ms) are the run's (run.lua).
--
-- KEYS[i]   log i: a sorted set; member "<time>:<j>", score = time in µs.
-- ARGV[1]   n: permits asked for (0 = probe).
-- ARGV[2]   mode: 0 = check (take nothing), 1 = take.
-- ARGV[3]   unused.
-- ARGV[4 + 2(i-1)]  log i: limit.
-- ARGV[5 + 2(i-1)]  log i: period in microseconds.
--
-- Returns {admitted (0|1), limit, remaining, reset_us, retry_us, now_us[, wait_us]}: reply
--          (all_or_nothing.lua).
-- A key lives until its newest member leaves the window.

local now = NOW  -- from run.lua, prepended
local n = ARGV[a] + 0
local mode = ARGV[a + 1]

-- Microseconds until `hits` more fit: the (total + hits - lim)-th oldest member must have left.
local function wait_for(key, total, lim, p, hits)
  if total + hits <= lim then return 0 end
  local oldest = redis.call('ZRANGE', key, total + hits - lim - 1, total + hits - lim - 1, 'WITHSCORES')
  return math.max(tonumber(oldest[2]) + p - now, 0)
end

-- Does every log admit? (decide: from all_or_nothing.lua, prepended)
for i = 1, nkeys do
  local key = KEYS[k + i - 1]
  local lim = ARGV[a + 1 + 2 * i] + 0  -- ARGV[4 + 2(i-1)]
  local p = ARGV[a + 2 + 2 * i] + 0
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now - p))
  local total = redis.call('ZCARD', key)
  local l = PARTS[i] or part(i, {lim = 0, p = 0, total = 0, fits = false})
  -- n == 0: a probe answers even over the limit (a settled reservation's debt).
  l.lim, l.p, l.total, l.fits = lim, p, total, total + n <= lim or n == 0
end
local admitted, limiting = decide(nkeys)

-- Taken only if all admitted; metadata of the state each log is left in.
local take = admitted == 1 and n > 0 and mode ~= '0'
local meta = fresh_meta()  -- folded by tighter (all_or_nothing.lua)
for i = 1, nkeys do
  local key = KEYS[k + i - 1]
  local l = PARTS[i]
  local total = l.total
  if take then
    local stamp = string.format('%.0f', now)
    -- Members taken in the same microsecond are numbered after the ones already there.
    local first = redis.call('ZCOUNT', key, stamp, stamp)
    for j = 1, n do
      redis.call('ZADD', key, stamp, stamp .. ':' .. (first + j))
    end
    total = total + n
    redis.call('PEXPIRE', key, math.max(math.ceil(l.p / 1000), 1, MIN_TTL))
  end
  local rst = 0
  if total > 0 then
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    rst = math.max(tonumber(newest[2]) + l.p - now, 0)
  end
  local wanted = 1
  if admitted == 0 and i == limiting then wanted = n end
  tighter(meta, l.lim, math.max(l.lim - total, 0), rst, wait_for(key, total, l.lim, l.p, wanted))
end
reply(r, admitted, meta, now, 0)
