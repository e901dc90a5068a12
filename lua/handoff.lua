-- handoff.lua: release.lua that, when it frees the lock, grants it at once to a waiter of the
-- releasing client (a fresh acquisition by the candidate's holder id, with a greater token),
-- when no other client waits: one round trip per handoff instead of a release, its message and
-- a second acquisition.
--
-- KEYS[1]  lock hash (also the name of the lock's release channel)
-- KEYS[2]  op record        this release's reply when it leaves entries (release.lua KEYS[2])
-- KEYS[3]  acquire record   the releasing holder's record; the release that frees the lock marks
--                           it "r:" .. ARGV[4], whether or not it hands the lock on
-- KEYS[4]  fence counter    string: highest token issued in this slot
-- KEYS[5]  candidate record the candidate's op record (keyed by its holder id): "c" once its
--                           acquisition was cancelled (cancel.lua), after which it is never
--                           granted; "r:<op id>" once a hold of it was released
-- ARGV[1]  holder id        the releasing holder
-- ARGV[2]  op record lifetime in ms
-- ARGV[3]  pub/sub mode     "sharded": SPUBLISH and SHARDNUMSUB (Redis Cluster); else PUBLISH
--                           and NUMSUB
-- ARGV[4]  op id            this release's operation id
-- ARGV[5]  candidate        holder id of the releasing client's first waiter for this lock
-- ARGV[6]  candidate's lease in ms, positive integer
-- ARGV[7]  candidate's label, optional (acquire.lua ARGV[5])
--
-- Returns  {1, n}           released once; n entries remain (n > 0: nothing handed on), or the
--                           lock was freed and its release published (n = 0): another client
--                           is subscribed to the channel, the candidate was cancelled, or its
--                           token would overflow
--          {2, token}       freed and granted to the candidate: the hash now maps candidate -> 1
--                           with this token (greater than every token issued before in the
--                           slot; its decimal text, as acquire.lua answers it) and the
--                           candidate's lease; nothing published (the lock never became free)
--          {-1}             the holder does not hold the lock; nothing changed
-- Errors   FENCELOCK_WRONGTYPE  the lock key holds a value this protocol did not write
--
-- Replays: a re-send of a release that freed the lock finds its mark. It answers {2, token}
-- while the candidate it names holds the lock (the grant the lost reply carried), else {1, 0};
-- release.lua replays the same mark as {1, 0}.
--
-- Who gets the lock: only a candidate of the releasing client, and only while no other client
-- is subscribed to the lock's channel. Every waiting client is subscribed (its first waiter
-- subscribes before it waits), so while another client waits, a release frees the lock and
-- publishes as release.lua does, and the clients race as they always have: a client's own
-- waiters cannot starve another client's. A client that subscribes between this check and the
-- next release waits at most for the hold granted here. In a cluster the count is the slot
-- owner's shard subscribers (sharded pub/sub), which is every waiting client's subscription.
--
-- The release is release.lua's, lock_release() of lib/release.lua, and the grant acquire.lua's,
-- lock_grant() of lib/acquire.lua; the loader prepends lib/next_token.lua, lib/acquire.lua and
-- lib/release.lua to this file.
local reply, replayed = lock_release(KEYS, ARGV, function()
  -- Every decision is read before the first write. A server or user that may not run PUBSUB
  -- (an ACL without it) counts as another client listening: the lock is freed and published.
  local listeners = redis.pcall('PUBSUB', ARGV[3] == 'sharded' and 'SHARDNUMSUB' or 'NUMSUB', KEYS[1])
  local alone = type(listeners) == 'table' and not listeners.err and listeners[2] <= 1
  -- take_token() writes the counter only when it issues (lib/next_token.lua).
  local token = alone and not redis.call('GET', KEYS[5]) and take_token(KEYS[4])
  redis.call('DEL', KEYS[1])
  if token then
    lock_grant(KEYS[1], ARGV[5], token, ARGV[7], ARGV[6])
    return {2, token}
  end
end)
-- A replay of the mark answers the grant its lost reply carried, while the candidate holds.
if replayed and redis.call('HGET', KEYS[1], ARGV[5]) then
  return {2, tonumber(redis.call('HGET', KEYS[1], '~token'))}
end
return reply
