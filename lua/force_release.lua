-- force_release.lua: the operator's escape hatch. Evicts whoever holds the lock, whatever its
-- holder id, makes sure the next acquisition's token is above the evicted one, and wakes waiters.
--
-- KEYS[1]  lock hash        fields: <holder id> -> re-entry count, "~token" -> fencing token,
--                           for an election "~leader", "~meta" (announce.lua; ignored here)
--                           (also the name of the lock's release channel)
-- KEYS[2]  fence counter    string: highest token issued in this slot (shared by every lock in it)
-- ARGV[1]  expected token   "" evicts any holder; a decimal token evicts only the holder of that
--                           token (so an operator who looked at the lock first cannot evict a
--                           holder that took it over in the meantime)
-- ARGV[2]  pub/sub mode     "sharded" publishes with SPUBLISH (Redis Cluster, where waiters
--                           listen on shard channels), anything else with PUBLISH
--
-- Returns  {1, token, fence, holder, count}
--                           evicted: the hash is deleted, the counter is now
--                           max(counter, token) = fence, and "force-released" was published on
--                           KEYS[1] (as ARGV[2] says); holder and count are the evicted holder id ("" if the hash
--                           had no holder field; "~reserved:<client id>" and 0 for a fair-handoff
--                           reservation, which has no token either) and its re-entry count
--          {0}              the lock is not held; nothing changed
--          {-1, token}      held, but with this token, not the expected one; nothing changed
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing modified
--          FENCELOCK_BADARG     ARGV[1] is not "" or a positive integer
--
-- The counter is raised to the evicted token (normally it is already there: acquire.lua wrote
-- it) so that the next token is above it even if the counter had been lost or lowered since
-- (restart without persistence, an operator's DEL) and the server clock is behind the clock that
-- issued it: acquire.lua then issues max(counter + 1, TIME) > token. This does not touch any
-- fenced resource's high-water mark: those are raised by the next holder's claim or write (see
-- DESIGN.md 3, "force_release.lua"). Every call that can fail (the reads, and the publish a
-- user may not be allowed) comes before the first write.
-- The loader prepends lib/calls.lua and lib/clock.lua to this file.
local expected = nil
if ARGV[1] ~= '' then
  expected = tonumber(ARGV[1])
  if not expected or expected < 1 or expected % 1 ~= 0 then
    return redis.error_reply('FENCELOCK_BADARG expected token must be a positive integer')
  end
end

-- One read is the type check (HGETALL of a non-hash fails) and the lock's state.
local fields = redis.pcall('HGETALL', KEYS[1])
if fields.err then
  return refused(fields, 'lock key is not a fencelock hash')
elseif #fields == 0 then
  return {0}
end
-- The counter, type-checked by its GET as next_token() (lib/next_token.lua) reads it.
local last = redis.pcall('GET', KEYS[2])
if type(last) == 'table' and last.err then
  return refused(last, 'fence counter is not a string')
end
last = tonumber(last or '0')
if last == nil then
  return redis.error_reply('FENCELOCK_WRONGTYPE fence counter does not hold an integer')
end

local token, holder, count = 0, '', 0
for i = 1, #fields, 2 do
  if fields[i] == '~token' then
    token = tonumber(fields[i + 1]) or 0
  elseif fields[i] == '~reserved' then
    -- A fair-handoff reservation (release_fair.lua): nobody holds it; evicting it frees the
    -- lock now instead of after the grace. Reported as holder "~reserved:<client id>".
    holder = '~reserved:' .. fields[i + 1]
  elseif string.sub(fields[i], 1, 1) == '~' then
    -- Any other protocol field (an election's "~leader" and "~meta") names no holder; holder
    -- ids never start with "~".
  else
    holder = fields[i]
    count = tonumber(fields[i + 1]) or 0
  end
end

if expected and expected ~= token then
  return {-1, token}
end

-- Published before the writes, which no subscriber can tell apart (a woken waiter's next
-- command runs after this script), so that a user who may not publish is refused before
-- anything is written, not after the eviction.
publish(ARGV[2], KEYS[1], 'force-released')
local fence = math.max(last, token)
if fence > last then
  redis.call('SET', KEYS[2], int_text(fence))
end
redis.call('DEL', KEYS[1])
return {1, token, fence, holder, count}
