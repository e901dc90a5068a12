-- release_all.lua: release.lua for several (lock, holder) pairs in one call: a multi-lock's
-- release of its whole set.
--
-- KEYS[2i-1]  lock hash of member i (also its release channel)
-- KEYS[2i]    op record of member i's release (as release.lua KEYS[2])
-- ARGV[1]     op record lifetime in ms
-- ARGV[1+i]   holder id of member i
--
-- Returns  {r1, ..., rN}   ri = n >= 0: member i released once, n entries remain (0: deleted
--                          and 'released' published on its channel); ri = -1: member i was
--                          not held by its holder, nothing changed for it
-- Errors   FENCELOCK_WRONGTYPE  a lock key holds foreign data; nothing modified (checked first)
--
-- Each member's op record is exactly release.lua's, so a release.lua re-sent later for the same
-- op id (a member guard finishing its release in the background) replays instead of
-- decrementing again, and vice versa.
local n = #KEYS / 2
for i = 1, n do
  local kind = redis.call('TYPE', KEYS[2 * i - 1])['ok']
  if kind ~= 'hash' and kind ~= 'none' then
    return redis.error_reply('FENCELOCK_WRONGTYPE lock key holds a ' .. kind .. ', not a fencelock hash')
  end
end
local reply = {}
for i = 1, n do
  local lock, op, holder = KEYS[2 * i - 1], KEYS[2 * i], ARGV[1 + i]
  local done = redis.call('GET', op)
  if done then
    reply[i] = tonumber(done)
  elseif redis.call('HEXISTS', lock, holder) == 0 then
    reply[i] = -1
  else
    local count = redis.call('HINCRBY', lock, holder, -1)
    if count <= 0 then
      count = 0
      redis.call('DEL', lock)
      redis.call('PUBLISH', lock, 'released')
    end
    redis.call('SET', op, count, 'PX', ARGV[1])
    reply[i] = count
  end
end
return reply
