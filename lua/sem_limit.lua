-- sem_limit.lua: an operator changes the limit of a semaphore in use, atomically.
--
-- KEYS[1]  semaphore hash   (layout in lib/sem_holds.lua; also its release channel)
-- KEYS[2]  lease zset
-- ARGV[1]  the new limit    positive integer
-- ARGV[2]  pub/sub mode     "sharded" publishes with SPUBLISH, else PUBLISH
--
-- Returns  {1, old limit}   the semaphore is in use: its recorded limit is now ARGV[1], which
--                           every acquisition is judged by from now on; holds above the new
--                           limit keep their permits until they leave (nothing is revoked);
--                           waiters were told, since a higher limit may let them in
--          {0}              the semaphore is not in use (no live hold): nothing is recorded,
--                           and its next acquisition records its own handle's limit
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing modified
--
-- The loader prepends lib/clock.lua and lib/sem_holds.lua to this file.
local sem, err = sem_open(KEYS[1], KEYS[2], {}, now_ms(), nil)
if not sem then
  return err
end
sem_purge(KEYS[1], KEYS[2], sem)
sem_settle(KEYS[1], KEYS[2])
if not sem_earliest(KEYS[1], KEYS[2]) then
  return {0}
end
local old = sem.limit
redis.call('HSET', KEYS[1], '~limit', ARGV[1])
sem_publish(KEYS[1], ARGV[2], nil)
return {1, old}
