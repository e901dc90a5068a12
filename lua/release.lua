-- release.lua: the holder leaves the lock once; the last exit frees it and wakes waiters.
--
-- KEYS[1]  lock hash (also the name of the lock's release channel)
-- KEYS[2]  op record        string: this operation's reply, kept for ARGV[2] ms so a re-sent
--                           request replays it instead of decrementing twice
-- KEYS[3]  acquire record   string: the holder's own op record (keyed by the holder id, written
--                           "a" by acquire.lua); the release that frees the lock overwrites it
--                           with "r:" .. ARGV[4] instead of writing KEYS[2]
-- ARGV[1]  holder id
-- ARGV[2]  op record lifetime in ms
-- ARGV[3]  pub/sub mode: "sharded" publishes the release with SPUBLISH (Redis Cluster: the
--          channel is the lock key, so it is in this script's slot); anything else: PUBLISH
-- ARGV[4]  op id            this release's operation id (the id in KEYS[2])
--
-- Returns  {1, n}           released once; n entries remain (0: the hash was deleted and a
--                           message was published on channel KEYS[1])
--          {-1}             the holder does not hold the lock (expired, deleted, or taken over);
--                           nothing changed, another holder's lock is never touched
-- Errors   FENCELOCK_WRONGTYPE  the lock key holds a value this protocol did not write
--
-- One op record per hold: a release that leaves entries records its reply under its own op id
-- (KEYS[2]); the release that frees the lock marks the holder's acquire record (KEYS[3]) with
-- its op id, "r:<op id>", instead of creating a second record. A re-sent copy of that release
-- finds no record of its own and no hash, and replays {1, 0} from the mark; any other release
-- of the holder that finds no hash answers {-1} as before. A late copy of the acquisition still
-- finds a record under its holder id and does nothing (acquire.lua).
local done = redis.call('GET', KEYS[2])
if done then
  return {1, tonumber(done)}
end

-- One read is the type check and the owner check: HGET of a non-hash fails (WRONGTYPE),
-- caught here before anything is written. Any other error (an ACL refusal) is returned as it is.
local count = redis.pcall('HGET', KEYS[1], ARGV[1])
if type(count) == 'table' and count.err then
  if string.sub(count.err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('FENCELOCK_WRONGTYPE lock key is not a fencelock hash')
  end
  return count
end
if not count then
  if redis.call('GET', KEYS[3]) == 'r:' .. ARGV[4] then
    return {1, 0}
  end
  return {-1}
end

local remaining = tonumber(count) - 1
if remaining > 0 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
  redis.call('SET', KEYS[2], remaining, 'PX', ARGV[2])
  return {1, remaining}
end
redis.call('DEL', KEYS[1])
redis.call(ARGV[3] == 'sharded' and 'SPUBLISH' or 'PUBLISH', KEYS[1], 'released')
redis.call('SET', KEYS[3], 'r:' .. ARGV[4], 'PX', ARGV[2])
return {1, 0}
