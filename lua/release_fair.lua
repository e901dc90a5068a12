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
-- whose last waiter gave up passes the reservation on at once (leave_fair.lua). Idempotency
-- as release.lua: a re-sent copy of the freeing release finds no holder field and replays
-- {1, 0} from the "r:<op id>" mark; the reservation is made once.
--
-- The release is release.lua's, lock_release() of lib/release.lua; only the freeing differs
-- (fair_pass_on, fair_queue of lib/fair.lua). The loader prepends lib/calls.lua,
-- lib/clock.lua, lib/release.lua and lib/fair.lua to this file.
return lock_release(KEYS, ARGV, function()
  -- The first write, and the only one that can fail: a queue of another type stops the
  -- release here with nothing changed.
  local first, failed = fair_pass_on(KEYS[1], KEYS[4], ARGV[5])
  if not first then
    return failed
  end
  -- Not when the lock was just reserved for the releasing client itself: its waiter will
  -- claim it, and a second entry would outlive that waiter and cost the others a grace later.
  if ARGV[6] ~= '' and first[1] ~= ARGV[6] then
    return fair_queue(KEYS[4], ARGV[6], ARGV[7])
  end
end)
