-- sem_handoff.lua: sem_release.lua that, when it gives a hold's permits back, grants them at
-- once to a waiter of the releasing client that they are enough for (a fresh acquisition by the
-- candidate's holder id, with a greater token), when no other client waits: one round trip per
-- handoff instead of a release, its message and a second acquisition (handoff.lua does the
-- same for a plain lock). Semaphores only: a read-write lock's holds are released by
-- sem_release.lua.
--
-- KEYS[1]  semaphore hash   (layout in lib/sem_holds.lua; also its release channel)
-- KEYS[2]  lease zset
-- KEYS[3]  op record        this release's reply when it leaves entries (sem_release.lua KEYS[3])
-- KEYS[4]  acquire record   the releasing holder's record; the release that ends the hold marks
--                           it "r:" .. ARGV[4], whether or not it hands the permits on
-- KEYS[5]  fence counter    string: highest token issued in this slot
-- KEYS[6]  candidate record the candidate's op record (keyed by its holder id): "c" once its
--                           acquisition was cancelled (sem_cancel.lua), after which it is never
--                           granted; "a" or "r:<op id>" once a send of it ran
-- ARGV[1]  holder id        the releasing holder
-- ARGV[2]  op record lifetime in ms
-- ARGV[3]  pub/sub mode     "sharded": SPUBLISH and SHARDNUMSUB (Redis Cluster); else PUBLISH
--                           and NUMSUB
-- ARGV[4]  op id            this release's operation id
-- ARGV[5]  candidate        holder id of the releasing client's first waiter for this semaphore
-- ARGV[6]  candidate's permits, positive integer
-- ARGV[7]  candidate's lease in ms, positive integer
-- ARGV[8]  candidate's label, optional (sem_acquire.lua ARGV[10])
--
-- Returns  {1, n}           left once; n entries remain (n > 0: nothing handed on), or the hold
--                           ended, its permits came back and a message was published (n = 0):
--                           another client is subscribed to the channel, the candidate was
--                           cancelled or already holds, too few permits are free for it, or its
--                           token would overflow
--          {2, token, limit, free}
--                           the hold ended and the candidate holds its permits with this token
--                           (greater than every token issued before in the slot), its lease and
--                           its label; `limit` permits in all, `free` left after the grant;
--                           nothing published (every waiter is of this client, which wakes its
--                           next waiter itself when permits are left)
--          {-1}             the holder holds nothing here; nothing of another hold is touched
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing modified
--
-- Replays: a re-send of a release that ended the hold finds its mark. It answers {2, ...} while
-- the candidate it names holds (the grant the lost reply carried), else {1, 0}; sem_release.lua
-- replays the same mark as {1, 0}, so either script replays the other's release.
--
-- Who gets the permits: only a candidate of the releasing client, and only while no other
-- client is subscribed to the semaphore's channel (every waiting client is: handoff.lua says
-- why that bounds every other client's wait). A candidate that already holds (a straggling
-- copy of its own acquisition ran) is not granted again: that would count its permits twice.
--
-- The release is sem_release.lua's (sem_release_hold of lib/sem_give.lua) and the grant
-- sem_acquire.lua's (sem_grant of lib/sem_take.lua); the loader prepends lib/clock.lua,
-- lib/sem_holds.lua, lib/next_token.lua and both to this file.
-- The grant's reply {2, token, limit, free} from the candidate's hold as the semaphore has it
-- now (free 0 when an operator lowered the limit below the permits held since); nil when the
-- candidate holds nothing.
local function granted(sem)
  local value = redis.call('HGET', KEYS[1], ARGV[5])
  if not value then
    return nil
  end
  local _, token_text = sem_hold_parse(value)
  return {2, tonumber(token_text), sem.limit, math.max(sem.limit - sem_used(KEYS[1]), 0)}
end

return sem_release_hold(KEYS, ARGV, nil, function(sem, clock, now)
  -- Every decision is read before the next write. A server or user that may not run PUBSUB
  -- (an ACL without it) counts as another client listening: the permits come back and are
  -- published.
  local limit = sem.limit
  local used = sem_used(KEYS[1])
  local wanted = tonumber(ARGV[6])
  local listeners = redis.pcall('PUBSUB', ARGV[3] == 'sharded' and 'SHARDNUMSUB' or 'NUMSUB', KEYS[1])
  local alone = type(listeners) == 'table' and not listeners.err and listeners[2] <= 1
  if alone and limit and used + wanted <= limit and not redis.call('GET', KEYS[6])
      and not redis.call('HGET', KEYS[1], ARGV[5]) then
    local token, token_text = next_token(KEYS[5], clock)
    if token then
      redis.call('SET', KEYS[5], token_text)
      sem_grant(KEYS[1], KEYS[2], ARGV[5], wanted, token_text, ARGV[8], limit, now + tonumber(ARGV[7]))
      return {2, token, limit, limit - used - wanted}
    end
  end
end, granted)
