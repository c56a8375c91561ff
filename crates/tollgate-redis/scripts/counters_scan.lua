-- counters_scan.lua: one step of listing the rate-limit server's counters (counters.lua's
-- hashes) whose keys match a pattern: one SCAN call, and the stored state of every key it found,
-- read at the same instant as `now`.
--
-- KEYS[1]   a key with the hash tag of the counters listed. It is not read: it routes the call
--           to the node holding that tag's slot on Redis Cluster, where all of them live.
-- ARGV[1]   now in microseconds, or '' to read the server's TIME.
-- ARGV[2]   SCAN cursor ('0' to start).
-- ARGV[3]   MATCH pattern (glob characters in the prefix and namespace escaped by the caller).
-- ARGV[4]   COUNT: how much of the keyspace this step looks at (not how many keys it returns).
--
-- Returns {next cursor ('0' when the scan is over), now_us, then for each key found: key,
--          s (window start µs), c (count)}; a key without both fields (another type or
--          layout) is left out. Keys may be seen twice across steps (SCAN's guarantee is only
--          that every key present throughout is seen at least once). Reads only.

local now = now_us(ARGV[1])  -- from clock.lua, prepended
local found = redis.call('SCAN', ARGV[2], 'MATCH', ARGV[3], 'COUNT', ARGV[4])
local reply = {found[1], string.format('%.0f', now)}
for _, key in ipairs(found[2]) do
  local stored = redis.pcall('HMGET', key, 's', 'c')
  if type(stored) == 'table' and stored[1] and stored[2] then
    reply[#reply + 1] = key
    reply[#reply + 1] = stored[1]
    reply[#reply + 1] = stored[2]
  end
end
return reply
