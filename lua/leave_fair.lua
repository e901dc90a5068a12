-- leave_fair.lua: a fair-handoff client's last waiter for a lock gave up (timeout, cancelled
-- future) without the lock: take the client off the lock's queue, and pass on a reservation
-- that was made for it, so that neither costs the other clients a grace. Best effort: when it
-- does not run (the client crashed, the call failed), the entry or the reservation simply ends
-- with its grace or the queue's expiry (see release_fair.lua).
--
-- KEYS[1]  lock hash (also the name of the lock's release channel)
-- KEYS[2]  queue            sorted set: client id -> time of its first failed attempt
-- ARGV[1]  client id
-- ARGV[2]  grace in ms      the lifetime of a reservation passed on to the next queued client
-- ARGV[3]  pub/sub mode: "sharded" publishes with SPUBLISH (Redis Cluster), anything else PUBLISH
--
-- Returns  {2}              the lock was reserved for this client: it is now reserved for the
--                           next queued client, or free, and "released" was published
--          {1}              the client's queue entry was removed; nothing else changed
--          {0}              the client was not queued and held no reservation; nothing changed
-- Errors   FENCELOCK_WRONGTYPE  the queue or lock key holds a value this protocol did not write;
--                           nothing modified
--
-- A lock reserved for someone else, or held, is never touched: only a hash whose only meaning
-- is "kept for this client" is handed on. If a new waiter of the same client queued again just
-- before this runs, its entry is removed too; it queues again at its next attempt (every
-- waiting head tries on every release), so that costs it its place once, never the lock.
-- The loader prepends lib/calls.lua, lib/clock.lua and lib/fair.lua (fair_pass_on, as
-- release_fair.lua passes a lock on) to this file.
local reserved = redis.pcall('HGET', KEYS[1], '~reserved')
if type(reserved) == 'table' and reserved.err then
  return refused(reserved, 'lock key is not a fencelock hash')
end
local removed = redis.pcall('ZREM', KEYS[2], ARGV[1])
if type(removed) == 'table' and removed.err then
  return refused(removed, 'queue key is not a fencelock sorted set')
end
if reserved ~= ARGV[1] then
  return {removed}
end
fair_pass_on(KEYS[1], KEYS[2], ARGV[2])
publish(ARGV[3], KEYS[1], 'released')
return {2}
