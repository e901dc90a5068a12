-- sem_release.lua: a holder leaves its hold once; the last entry gives its permits back and
-- wakes waiters.
--
-- KEYS[1]  semaphore hash   (layout in lib/sem_holds.lua; also its release channel)
-- KEYS[2]  lease zset
-- KEYS[3]  op record        string: this release's reply when it left entries ("remaining"),
--                           kept ARGV[2] ms so a re-sent copy replays it
-- KEYS[4]  acquire record   string: the holder's own op record (keyed by the holder id, "a"
--                           since the acquisition); the release that ends the hold overwrites
--                           it with "r:" .. ARGV[4] instead of writing KEYS[3]
-- KEYS[5]  a read-write lock's waiting writers (zset; also their channel): also published
--          on; absent for a semaphore
-- ARGV[1]  holder id
-- ARGV[2]  op record lifetime in ms
-- ARGV[3]  pub/sub mode     "sharded" publishes with SPUBLISH, else PUBLISH
-- ARGV[4]  op id            this release's operation id
--
-- Returns  {1, n}           left once; n entries remain (a read-write lock's hold entered again
--                           through its guard); nothing else changed
--          {1, 0}           released (the permits are free, the hold's field is gone with the
--                           label it kept, and a message was published on KEYS[1], and KEYS[5]
--                           if given; a read-write lock's release that leaves holds publishes
--                           nothing on the lease-zset path: below), or a replay of this same
--                           release (its mark is found)
--          {-1}             the holder holds nothing here (its lease ended, it was released
--                           by another op or an operator); nothing of another hold is touched
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing modified
--
-- As in release.lua, one record per hold: a release that leaves entries records its reply
-- under its own op id (KEYS[3]); the release that ends the hold marks the holder's acquire
-- record (KEYS[4]) instead, and a late copy of the acquisition finds that mark and does
-- nothing. Expired holds are dropped first, so a holder whose lease ended is told {-1} even
-- before anyone else purged it.
local sem, err = sem_open(KEYS[1], KEYS[2], ARGV[1], now_ms(), nil)
if not sem then
  return err
end
-- The hold's field, read once by sem_open: also what sem_drop would read (none reads false).
local left, held = sem_leave_entry(KEYS[1], KEYS[2], ARGV[1], KEYS[3], ARGV[2], sem)
if left then
  return left
end
local permits = sem_drop(KEYS[1], KEYS[2], ARGV[1], held)
sem_settle(KEYS[1], KEYS[2])
if permits == 0 then
  if redis.call('GET', KEYS[4]) == 'r:' .. ARGV[4] then
    return {1, 0}
  end
  return {-1}
end
-- A read-write lock's release that leaves holds (known on the lease-zset path) wakes nobody:
-- its waiting writers wait for no hold at all, and its waiting readers for a writer's hold or
-- mark, which a reader's release does not end.
if not (KEYS[5] and not FIELD_EXPIRY and USED > 0) then
  sem_publish(KEYS[1], ARGV[3], KEYS[5])
end
redis.call('SET', KEYS[4], 'r:' .. ARGV[4], 'PX', ARGV[2])
return {1, 0}
