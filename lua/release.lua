-- release.lua: the holder leaves the lock once; the last exit frees it and wakes waiters.
--
-- KEYS[1]  lock hash (also the name of the lock's release channel)
-- KEYS[2]  op record        string: this operation's reply, kept for ARGV[2] ms so a re-sent
--                           request replays it instead of decrementing twice
-- ARGV[1]  holder id
-- ARGV[2]  op record lifetime in ms
-- ARGV[3]  pub/sub mode: "sharded" publishes the release with SPUBLISH (Redis Cluster: the
--          channel is the lock key, so it is in this script's slot); anything else: PUBLISH
--
-- Returns  {1, n}           released once; n entries remain (0: the hash was deleted and a
--                           message was published on channel KEYS[1])
--          {-1}             the holder does not hold the lock (expired, deleted, or taken over);
--                           nothing changed, another holder's lock is never touched
-- Errors   FENCELOCK_WRONGTYPE  the lock key holds a value this protocol did not write
local done = redis.call('GET', KEYS[2])
if done then
  return {1, tonumber(done)}
end

local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'hash' and kind ~= 'none' then
  return redis.error_reply('FENCELOCK_WRONGTYPE lock key holds a ' .. kind .. ', not a fencelock hash')
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return {-1}
end

local count = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if count <= 0 then
  count = 0
  redis.call('DEL', KEYS[1])
  redis.call(ARGV[3] == 'sharded' and 'SPUBLISH' or 'PUBLISH', KEYS[1], 'released')
end
redis.call('SET', KEYS[2], count, 'PX', ARGV[2])
return {1, count}
