-- sem_release.lua: a holder gives its permits back; waiters are woken.
--
-- KEYS[1]  semaphore hash   (layout in lib/sem_holds.lua; also its release channel)
-- KEYS[2]  lease zset
-- KEYS[3]  acquire record   string: the holder's own op record (keyed by the holder id, "a"
--                           since sem_acquire.lua); the release overwrites it with
--                           "r:" .. ARGV[4], which is this release's record
-- KEYS[4]  a read-write lock's waiting writers (zset; also their channel): also published
--          on; absent for a semaphore
-- ARGV[1]  holder id
-- ARGV[2]  op record lifetime in ms
-- ARGV[3]  pub/sub mode     "sharded" publishes with SPUBLISH, else PUBLISH
-- ARGV[4]  op id            this release's operation id
--
-- Returns  {1, 0}           released (the permits are free and a message was published on
--                           KEYS[1], and KEYS[4] if given), or a replay of this same release (its mark is found)
--          {-1}             the holder holds nothing here (its lease ended, it was released
--                           by another op or an operator); nothing of another hold is touched
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing modified
--
-- A hold is released whole (a semaphore hold has no re-entries), so one record per hold is
-- enough, as in release.lua: the holder's acquire record becomes the release's mark, and a
-- late copy of the acquisition finds it and does nothing. Expired holds are dropped first, so
-- a holder whose lease ended is told {-1} even before anyone else purged it.
local err = sem_check(KEYS[1], KEYS[2])
if err then
  return err
end
sem_purge(KEYS[1], KEYS[2], now_ms())
local permits = sem_drop(KEYS[1], KEYS[2], ARGV[1])
sem_settle(KEYS[1], KEYS[2])
if permits == 0 then
  if redis.call('GET', KEYS[3]) == 'r:' .. ARGV[4] then
    return {1, 0}
  end
  return {-1}
end
sem_publish(KEYS[1], ARGV[3], KEYS[4])
redis.call('SET', KEYS[3], 'r:' .. ARGV[4], 'PX', ARGV[2])
return {1, 0}
