-- counters_scan.lua: one step of listing the rate-limit server's counters (counters.lua's
-- windows) whose keys match a pattern: one SCAN call, and the stored state of every key it found,
-- read at the same instant as `now`.
--
-- KEYS[1]   a key with the hash tag of the counters listed. It is not read: it routes the call
--           to the node holding that tag's slot on Redis Cluster, where all of them live.
-- ARGV[1]   now in microseconds, or '' to read the server's TIME.
-- ARGV[2]   SCAN cursor ('0' to start).
-- ARGV[3]   MATCH pattern (glob characters in the prefix and namespace escaped by the caller).
-- ARGV[4]   COUNT: how much of the keyspace this step looks at (not how many keys it returns).
-- ARGV[5]   the expiry shift in ms (fixed_lib.lua's fixed_clock: 0 on Redis TIME).
--
-- Returns {next cursor ('0' when the scan is over), now_us, then for each key found: key,
--          the window's end (µs), its count}; a key of another type is left out (so is one an
--          earlier tollgate wrote, a hash, until a decision rewrites it). Keys may be seen twice across steps (SCAN's guarantee is only
--          that every key present throughout is seen at least once). Reads only.

local now = now_us(ARGV[1])  -- from clock.lua, prepended
fixed_clock(now, ARGV[5] + 0)  -- from fixed_lib.lua, prepended
local found = redis.call('SCAN', ARGV[2], 'MATCH', ARGV[3], 'COUNT', ARGV[4])
local reply = {found[1], string.format('%.0f', now)}
for _, key in ipairs(found[2]) do
  local count = redis.pcall('GET', key)
  if type(count) == 'string' then
    reply[#reply + 1] = key
    reply[#reply + 1] = string.format('%.0f', fixed_end(key))
    reply[#reply + 1] = count
  end
end
return reply
