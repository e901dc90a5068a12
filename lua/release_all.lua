-- release_all.lua: release.lua for several (lock, holder) pairs in one call: a multi-lock's
-- release of its whole set.
--
-- KEYS[3i-2]  lock hash of member i (also its release channel)
-- KEYS[3i-1]  op record of member i's release (as release.lua KEYS[2])
-- KEYS[3i]    acquire record of member i's holder (as release.lua KEYS[3])
-- ARGV[1]     op record lifetime in ms
-- ARGV[2i]    holder id of member i
-- ARGV[2i+1]  op id of member i's release (the id in KEYS[3i-1])
--
-- Returns  {r1, ..., rN}   ri = n >= 0: member i released once, n entries remain (0: deleted
--                          and 'released' published on its channel); ri = -1: member i was
--                          not held by its holder, nothing changed for it
-- Errors   FENCELOCK_WRONGTYPE  a lock key holds foreign data; nothing modified (checked first)
--
-- Each member's records are exactly release.lua's (a release that leaves entries records its
-- reply under its op id; the one that frees the lock marks the holder's acquire record
-- "r:<op id>"),
-- so a release.lua re-sent later for the same op id (a member guard finishing its release in
-- the background) replays instead of decrementing again, and vice versa.
local n = #KEYS / 3
-- Every member's read that can fail (HGET of a non-hash) comes before the first write; any
-- error other than WRONGTYPE (an ACL refusal) is returned as it is.
local counts = {}
for i = 1, n do
  local count = redis.pcall('HGET', KEYS[3 * i - 2], ARGV[2 * i])
  if type(count) == 'table' and count.err then
    if string.sub(count.err, 1, 9) == 'WRONGTYPE' then
      return redis.error_reply('FENCELOCK_WRONGTYPE lock key is not a fencelock hash')
    end
    return count
  end
  counts[i] = count
end
local reply = {}
for i = 1, n do
  local lock, op, acquired = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local holder, mark = ARGV[2 * i], 'r:' .. ARGV[2 * i + 1]
  local done = redis.call('GET', op)
  if done then
    reply[i] = tonumber(done)
  elseif not counts[i] then
    reply[i] = (redis.call('GET', acquired) == mark) and 0 or -1
  else
    local remaining = tonumber(counts[i]) - 1
    if remaining > 0 then
      redis.call('HINCRBY', lock, holder, -1)
      redis.call('SET', op, remaining, 'PX', ARGV[1])
    else
      remaining = 0
      redis.call('DEL', lock)
      redis.call('PUBLISH', lock, 'released')
      redis.call('SET', acquired, mark, 'PX', ARGV[1])
    end
    reply[i] = remaining
  end
end
return reply
