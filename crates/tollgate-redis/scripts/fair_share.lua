-- fair_share.lua: one holder's share of a counter's limit, decided among the holders of every
-- server on this Redis and the counter's RLS callers (the rate-limit server's RLQS: each holder
-- is one Envoy instance, and its share is what the assignments of its buckets on the counter may
-- admit per window together), and what those shares may admit reserved in the counter's window,
-- so that RLS callers see it.
--
-- The rule (the server's in-memory ledger applies the same, `protocol/rlqs/ledger.rs`):
-- - The RLS callers' use of the counter's open window is its count less what this script
--   reserved in it. They are one more holder: they want nothing after a window they did not
--   use, twice what they used and a fiftieth of the limit after one that was full (they were
--   held back), else what they used, a tenth more and a fiftieth of the limit; at most the limit.
-- - The holder's want is what it asks, or what it wanted at its last report (if it holds a live
--   share) when that is more by no more than a fiftieth of the limit: a changed share rebuilds
--   the Envoy's token bucket, full, so a want wavering across a step of Envoy's grid must not
--   move the shares at every report. A larger want is taken at once.
-- - The holder's share is its max-min fair share of the limit among the live holders' wants and
--   the RLS callers', and never more than the room: the limit less what the other live holders
--   hold now, the RLS callers' fair share or what they used of the window if more, and what the
--   changes of share of the last window rebuilt. So the sum of what is held stays within what the window has left while shares
--   move from one holder to another: a share is handed out only once its old holder has been
--   given less.
-- - A change of the holder's share rebuilds its Envoy's token buckets, each starting full on top
--   of what the old one admitted: it adds at most min(ARGV[8], ARGV[9] + the new share) to a
--   window, and nothing for a share of 0 (no bucket starts: Envoy denies all) (the caller
--   works the bursts out; this script holds no formula for them). A change is
--   made only when the new share and that charge fit in the room together, and the charge is
--   kept for a window (rounded up to an eighth of one); else as much of an increase as fits, or
--   the share is kept (unless the room no longer holds it). The charges never cut a share (the
--   room always holds what the holder has), so they do not move the shares again. A holder that
--   rebuilds its buckets at an unchanged share (ARGV[10]) is charged the same, and pays out of
--   its share when the room lacks the charge.
-- - What all live holders hold and the charges are reserved in the counter's open window
--   (counted into it, up to its limit), so RLS callers get only what the assignments leave; a
--   window seen for the first time also what the holders held when it opened, and when the last
--   one was left behind (if within a window's time), as Envoys admitted by those until then. A
--   window is not opened here: until an RLS caller opens one, nothing needs reserving (RLS
--   decisions open it, and the next report reserves in it).
-- - Seeing a window (ARGV[2] ''): an RLS decision opened the counter's window, found it full or
--   came near its end. Nothing is assigned: the window is seen as a report would see it (what
--   the RLS callers used of it, a new window's floor) and what the holders hold is reserved in
--   it, with the claims of holders given less than their fair share at their last report for
--   lack of room (each up to its want or the level of the fair division now), out of what the
--   RLS callers' fair part leaves: in windows shorter than the reports' interval, RLS callers
--   wanting much would take all the holders do not hold early in each window, and a report
--   would always find the window used up. Nothing happens for a counter no one holds.
-- Why one script: the holders, the RLS callers' use and the reservation are read and written
-- together, so two servers deciding at once neither over-assign nor reserve twice.
--
-- KEYS[1]  the counter's holders: a hash, field = holder, value = "<want> <held> <expires_us>
--          <short>" (short: 1 when the holder was given less than its fair share for lack of
--          room; absent in what an earlier version wrote);
--          and field "rls" = "<window end, µs> <reserved> <used> <want> <seen_us> <floor>" (the
--          window last seen, 0 for none; what was reserved in it; what the RLS callers used of
--          it; what they want; when a window was last seen open or found left behind; what the
--          holders held when the last window was left behind); and field "rebuilt" = "<until_us>
--          <hits> ..." (the changes' charges still in force, by until). The key expires with its
--          last holder's assignment, or its last charge if later.
-- KEYS[2]  the counter's window, as the RLS decisions keep it (fixed_lib.lua: a string holding
--          the count, expiring at the window's end, read by fixed_read); same hash tag (the
--          namespace) as KEYS[1].
-- ARGV[1]  now in microseconds, or '' to read the server's TIME (clock.lua).
-- ARGV[2]  the holder; '' to see the window only (above), with ARGV[4] 0, ARGV[8..10] 0 0 0.
-- ARGV[3]  the limit: hits per window.
-- ARGV[4]  what the holder wants: hits per window.
-- ARGV[5]  how long the holder's assignment lives, in microseconds.
-- ARGV[6]  the window's length in milliseconds (two windows' ends are at least that far apart).
-- ARGV[7]  on a passed-in clock (ARGV[1] set), how far past its end on that clock a window's key
--          expires, in ms (`RedisTime`'s expiry shift); 0 on Redis TIME.
-- ARGV[8]  the most a change of the holder's share adds to a window (its buckets' bursts, old or
--          new, whichever is more, bucket by bucket).
-- ARGV[9]  the bursts of the holder's buckets now (a change to a share s adds at most this + s).
-- ARGV[10] '1' when the holder would rebuild its buckets even at an unchanged share (their split
--          of it moved): charged as a change is, and paid out of the share when the room lacks
--          it (down to 0 at most, which is charged nothing).
--
-- Returns {share, holders, held, reserved, exhausted, rebuilt}: what the holder now holds,
-- recorded until now + ARGV[5]; how many live holders the counter has, this one included; what
-- they hold in all; what was counted into the window now; 1 when the RLS callers alone used the
-- window up (nothing is left until it ends), else 0; 1 when the holder's buckets are rebuilt
-- (its share changed, or ARGV[10] asked and the room held the charge), else 0. Holders whose
-- assignment expired are removed. Seeing a window returns a share of 0 and no rebuild.

local key, counter, holder = KEYS[1], KEYS[2], ARGV[2]
local seeing = holder == ''
local now = now_us(ARGV[1])  -- from clock.lua, prepended
local limit, want, ttl, window, shift = ARGV[3] + 0, ARGV[4] + 0, ARGV[5] + 0, ARGV[6] + 0, ARGV[7] + 0
local rebuild_most, rebuild_held, resplit = ARGV[8] + 0, ARGV[9] + 0, ARGV[10] == '1'

-- The counter's open window, as fixed_lib.lua reads it (prepended): its count and its end (µs
-- on the decision clock; nil when none is open; a key of another type is none).
fixed_clock(now, shift)
local count, ends = fixed_read(counter, now, window * 1000)
if count == nil then count, ends = 0, nil end

local fields = redis.call('HGETALL', key)
-- The live holders: their wants, what the others hold, and what this one held; the others'
-- holds given short of their fair share at their last report ({want, held}: their claims).
local wants, others, mine, had, shorts = {0}, 0, 0, nil, {}
for i = 1, #fields, 2 do
  local field = fields[i]
  if field == holder then
    local w, held, expires = string.match(fields[i + 1], '(%d+) (%d+) (%d+)')
    if expires and expires + 0 > now then mine, had = held + 0, w + 0 end
  elseif field ~= 'rls' and field ~= 'rebuilt' then
    local w, held, expires, short = string.match(fields[i + 1], '(%d+) (%d+) (%d+) ?(%d*)')
    if expires and expires + 0 > now then
      wants[#wants + 1] = w + 0
      others = others + held
      if short == '1' then shorts[#shorts + 1] = {w + 0, held + 0} end
    else
      redis.call('HDEL', key, field)
    end
  end
end
local holders = #wants
local step = (limit - limit % 50) / 50
if step < 1 then step = 1 end
if had and want < had and had - want <= step then want = had end
wants[1] = want

-- The RLS callers: a window other than the last one seen starts a new count. Their want is
-- planned from the window left behind; a window after a time with none keeps it; after a whole
-- window's time with none open, they want nothing (their first hit opens a window).
local rls_end, reserved, used, rls_want, seen_at, floor = 0, 0, 0, 0, 0, 0
-- The charges still in force: {until, hits} pairs, by until.
local charges, rebuilt = {}, 0
for i = 1, #fields, 2 do
  if fields[i] == 'rls' then
    local e, r, u, w, at, f = string.match(fields[i + 1], '(%d+) (%d+) (%d+) (%d+) (%d+) (%d+)')
    if f then rls_end, reserved, used, rls_want, seen_at, floor = e + 0, r + 0, u + 0, w + 0, at + 0, f + 0 end
  elseif fields[i] == 'rebuilt' then
    for u, h in string.gmatch(fields[i + 1], '(%d+) (%d+)') do
      if u + 0 > now then
        charges[#charges + 1] = {u + 0, h + 0}
        rebuilt = rebuilt + h
      end
    end
  end
end
if seeing and holders == 1 and rebuilt == 0 then return {0, 0, 0, 0, 0, 0} end  -- no one holds it
local same = ends ~= nil and rls_end > 0 and math.abs(ends - rls_end) < window * 500  -- half a window, µs
if not same then
  if rls_end > 0 then  -- left behind by now: the holds in force count as the window's last
    floor, seen_at = others + mine + rebuilt, now
    if used == 0 then
      rls_want = 0
    else
      local grid = (limit - limit % 50) / 50
      if grid < 1 then grid = 1 end
      if used + reserved + grid >= limit then
        rls_want = 2 * used + grid
      else
        rls_want = used + (used - used % 10) / 10 + grid
      end
      if rls_want > limit then rls_want = limit end
    end
  elseif ends == nil and now - seen_at >= window * 1000 then
    rls_want = 0
  end
  rls_end, reserved, used = ends or 0, 0, 0
end
local opened = ends ~= nil and not same
local recent = now - seen_at < window * 1000
if ends ~= nil then
  if count - reserved > used then used = count - reserved end
  seen_at = now
end

wants[#wants + 1] = rls_want

-- Water-filling: the smallest wants are met in full while they are under an equal split of
-- what is left; past that, everyone left gets the level (and one of the units it leaves over).
table.sort(wants)
-- The RLS callers are last in the ledger's order, so never get one of those units.
local left, fair, rls_fair, cap = limit, want, rls_want, nil
for k = 1, #wants do
  local waiting = #wants - k + 1
  local level = (left - left % waiting) / waiting
  if wants[k] > level then
    cap = level
    if want > level then
      fair = level
      if left - level * waiting > 0 then fair = level + 1 end
    end
    if rls_want > level then rls_fair = level end
    break
  end
  left = left - wants[k]
end
-- The room leaves the RLS callers their fair part of the window, or what they used if more: the
-- rebuilds' charges are the Envoys' to pay.
local rls_part = used
if rls_fair > rls_part then rls_part = rls_fair end
local room = limit - others - rls_part - rebuilt
if room < 0 then room = 0 end
local function charge_for(s)
  if s == 0 then return 0 end  -- a share of 0 starts no bucket (Envoy denies all)
  if rebuild_held + s < rebuild_most then return rebuild_held + s end
  return rebuild_most
end
local target = fair
if room < target then target = room end
local share, rebuilding = target, target ~= mine or resplit
if rebuilding and target + charge_for(target) > room then
  -- The largest share that fits with its charge.
  local fits = room - rebuild_most
  local half = room - rebuild_held
  if half < 0 then half = 0 end
  half = (half - half % 2) / 2
  if half > fits then fits = half end
  if fits < 0 then fits = 0 end
  if target < fits then fits = target end
  if fits > mine or mine > room or resplit then
    share = fits
  else
    share, rebuilding = mine, false
  end
end
local charged = 0
if rebuilding then charged = charge_for(share) end
if charged > 0 then
  local slot = window * 125  -- an eighth of a window, µs
  local last = now + window * 1000
  last = (last + slot - 1 - (last + slot - 1) % slot)
  if #charges > 0 and charges[#charges][1] == last then
    charges[#charges][2] = charges[#charges][2] + charged
  else
    charges[#charges + 1] = {last, charged}
  end
  rebuilt = rebuilt + charged
end

-- What the holders hold is reserved in the open window, up to its limit; a window seen for the
-- first time holds what the assignments in force when it opened (and when the last one was left
-- behind, if within a window's time) may admit, this holder's old one included (Envoys admitted
-- by them until now, and a stretch of a window's length that spans the last window's end and
-- this one's start holds both: RLS callers take their part at a window's start).
local reserve = 0
if ends ~= nil then
  local target = others + share + rebuilt
  if seeing then
    -- The claims of holders given short of their fair share (the level, no odd unit), out of
    -- what the RLS callers' fair part leaves.
    local shortfall = 0
    for _, c in ipairs(shorts) do
      local f = c[1]
      if cap and f > cap then f = cap end
      if f > c[2] then shortfall = shortfall + f - c[2] end
    end
    local spare = limit - rls_fair - target
    if spare < 0 then spare = 0 end
    if shortfall > spare then shortfall = spare end
    target = target + shortfall
  end
  if opened then
    if mine > share then target = others + mine + rebuilt end
    local least = floor
    if not recent then least = 0 end
    if least > target then target = least end
  end
  reserve = target - reserved
  if reserve > limit - count then reserve = limit - count end
  if reserve < 0 then reserve = 0 end
  if reserve > 0 then redis.call('INCRBY', counter, reserve) end
  reserved = reserved + reserve
end

local rls = string.format('%.0f %.0f %.0f %.0f %.0f %.0f', rls_end, reserved, used, rls_want, seen_at, floor)
if seeing then
  redis.call('HSET', key, 'rls', rls)
else
  local short = 0
  if share < fair then short = 1 end
  redis.call('HSET', key, holder, string.format('%.0f %.0f %.0f %d', want, share, now + ttl, short), 'rls', rls)
end
local lives = ttl
if #charges > 0 then
  local parts = {}
  for i = 1, #charges do parts[i] = string.format('%.0f %.0f', charges[i][1], charges[i][2]) end
  redis.call('HSET', key, 'rebuilt', table.concat(parts, ' '))
  if charges[#charges][1] - now > lives then lives = charges[#charges][1] - now end
else
  redis.call('HDEL', key, 'rebuilt')
end
local ttl_ms = (lives - lives % 1000) / 1000 + 1
if redis.call('PTTL', key) < ttl_ms then redis.call('PEXPIRE', key, ttl_ms) end
local exhausted = 0
if used >= limit then exhausted = 1 end
local rebuilds = 0
if rebuilding then rebuilds = 1 end
return {share, holders, others + share, reserve, exhausted, rebuilds}
