-- fair_share.lua: one holder's share of a counter's limit, decided among the holders of every
-- server on this Redis (the rate-limit server's RLQS: each holder is one Envoy instance, and its
-- share is what the assignments of its buckets on the counter may admit per window together).
--
-- The rule (the server's in-memory ledger applies the same, `protocol/rlqs/ledger.rs`): the
-- holder's share is its max-min fair share of the limit among the live holders' wants, and never
-- more than the limit less what the other live holders hold now. So the sum of what is held stays
-- within the limit while shares move from one holder to another: a share is handed out only once
-- its old holder has been given less.
--
-- KEYS[1]  the counter's holders: a hash, field = holder, value = "<want> <held> <expires_us>".
--          The key expires with its last holder's assignment.
-- ARGV[1]  now in microseconds, or '' to read the server's TIME (clock.lua).
-- ARGV[2]  the holder.
-- ARGV[3]  the limit: hits per window.
-- ARGV[4]  what the holder wants: hits per window.
-- ARGV[5]  how long the holder's assignment lives, in microseconds.
--
-- Returns {share, holders, held}: what the holder now holds, recorded until now + ARGV[5]; how
-- many live holders the counter has, this one included; what they hold in all. Holders whose
-- assignment expired are removed.

local key, holder = KEYS[1], ARGV[2]
local now = now_us(ARGV[1])  -- from clock.lua, prepended
local limit, want, ttl = ARGV[3] + 0, ARGV[4] + 0, ARGV[5] + 0
local fields = redis.call('HGETALL', key)
local wants, others = {want}, 0
for i = 1, #fields, 2 do
  local field = fields[i]
  if field ~= holder then
    local w, held, expires = string.match(fields[i + 1], '(%d+) (%d+) (%d+)')
    if expires and expires + 0 > now then
      wants[#wants + 1] = w + 0
      others = others + held
    else
      redis.call('HDEL', key, field)
    end
  end
end

-- Water-filling: the smallest wants are met in full while they are under an equal split of
-- what is left; past that, everyone left gets the level (and one of the units it leaves over).
table.sort(wants)
local left, fair = limit, want
for k = 1, #wants do
  local waiting = #wants - k + 1
  local level = (left - left % waiting) / waiting
  if wants[k] > level then
    if want > level then
      fair = level
      if left - level * waiting > 0 then fair = level + 1 end
    end
    break
  end
  left = left - wants[k]
end
local share = limit - others
if share < 0 then share = 0 end
if fair < share then share = fair end

redis.call('HSET', key, holder, string.format('%.0f %.0f %.0f', want, share, now + ttl))
local ttl_ms = (ttl - ttl % 1000) / 1000 + 1
if redis.call('PTTL', key) < ttl_ms then redis.call('PEXPIRE', key, ttl_ms) end
return {share, #wants, others + share}
