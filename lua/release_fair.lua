-- release_fair.lua: release.lua for clients in fair-handoff mode. The release that frees the
-- lock hands it to the first client in the lock's queue (acquire_fair.lua) by leaving a
-- reservation for it instead of deleting the hash. The default mode never runs this script.
--
-- KEYS[1]  lock hash (also the name of the lock's release channel)
-- KEYS[2]  op record        string: this operation's reply, kept for ARGV[2] ms so a re-sent
--                           request replays it instead of decrementing twice
-- KEYS[3]  acquire record   string: the holder's own op record (keyed by the holder id); the
--                           release that frees the lock overwrites it with "r:" .. ARGV[4]
-- KEYS[4]  queue            sorted set: client id -> time of its first failed attempt
-- ARGV[1]  holder id
-- ARGV[2]  op record lifetime in ms
-- ARGV[3]  pub/sub mode: "sharded" publishes with SPUBLISH (Redis Cluster), anything else PUBLISH
-- ARGV[4]  op id            this release's operation id (the id in KEYS[2])
-- ARGV[5]  grace in ms      how long a reservation waits for its client to claim it
-- ARGV[6]  client id to queue again at the back ("" for none): the releasing client, when it
--          has more local waiters for this lock; done here, in the same step as the release,
--          so that a client served just before cannot slip in ahead of it while its waiter's
--          own attempt is still on its way (skipped when the lock is reserved for this very
--          client: its waiter claims it)
-- ARGV[7]  queue lifetime in ms after this release (when ARGV[6] queued a client)
--
-- Returns  {1, n}           released once; n entries remain (0: the lock is free or reserved
--                           for the first queued client, and "released" was published on KEYS[1])
--          {-1}             the holder does not hold the lock; nothing changed
-- Errors   FENCELOCK_WRONGTYPE  the lock or queue key holds a value this protocol did not write;
--                           nothing modified
--
-- The reservation is the hash with the single field "~reserved" = client id and a lease of
-- ARGV[5] ms: no holder field, so nobody holds it and every other client's attempt sees a held
-- lock; only that client's acquire_fair.lua claims it (with a new token). A client that does
-- not claim in time (crashed) costs one grace, then the lock is free for anyone; a live client
-- whose last waiter gave up passes the reservation on at once (leave_fair.lua). Idempotency as release.lua: a re-sent copy of the freeing release finds no holder
-- field and replays {1, 0} from the "r:<op id>" mark; the reservation is made once.
local done = redis.call('GET', KEYS[2])
if done then
  return {1, tonumber(done)}
end

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
-- The first write, and the only one that can fail: a queue of another type stops the release
-- here with nothing changed.
local first = redis.pcall('ZPOPMIN', KEYS[4])
if type(first) == 'table' and first.err then
  if string.sub(first.err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('FENCELOCK_WRONGTYPE queue key is not a fencelock sorted set')
  end
  return first
end
redis.call('DEL', KEYS[1])
if first[1] then
  redis.call('HSET', KEYS[1], '~reserved', first[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
end
-- Not when the lock was just reserved for the releasing client itself: its waiter will claim
-- it, and a second entry would outlive that waiter and cost the others a grace later.
if ARGV[6] ~= '' and first[1] ~= ARGV[6] then
  local now = redis.call('TIME')
  local score = string.format('%.0f', tonumber(now[1]) * 1000000 + tonumber(now[2]))
  redis.call('ZADD', KEYS[4], 'NX', score, ARGV[6])
  redis.call('PEXPIRE', KEYS[4], ARGV[7])
end
redis.call(ARGV[3] == 'sharded' and 'SPUBLISH' or 'PUBLISH', KEYS[1], 'released')
redis.call('SET', KEYS[3], 'r:' .. ARGV[4], 'PX', ARGV[2])
return {1, 0}
