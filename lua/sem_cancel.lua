-- sem_cancel.lua: undo exactly one acquisition or re-entry of a hold whose caller gave up on
-- it (cancelled future, ambiguous error), whether or not it has run yet.
--
-- KEYS[1]  semaphore hash   (layout in lib/sem_holds.lua; also its release channel)
-- KEYS[2]  lease zset
-- KEYS[3]  op record of the operation being undone (an acquisition's is keyed by its holder
--          id; a re-entry's by its own op id)
-- KEYS[4]  the waiting acquisitions: a read-write lock's waiting writers (zset; also their
--          channel), or a semaphore's fair queue (zset); the acquisition's entry there is
--          removed too (a waiter that gave up)
-- KEYS[5]  a semaphore's fair-queue entries (hash: holder id -> "<permits>:<deadline>"): its
--          entry is removed too; absent for a read-write lock
-- ARGV[1]  holder id
-- ARGV[2]  op record lifetime in ms
-- ARGV[3]  pub/sub mode     "sharded" publishes with SPUBLISH, else PUBLISH
-- ARGV[4]  "acquire" or "reenter": which operation KEYS[3] belongs to
--
-- Returns  {1, n}           a re-entry had run and was undone: n entries remain (0: it was the
--                           hold's last, the hold ended and a message was published)
--          {1, 0}           the acquisition had run and was undone: its permits are free, its
--                           field is gone with the label it kept, and a message was published
--                           on KEYS[1] (and KEYS[4]); the same message
--                           goes out when only a waiting writer's mark was removed
--          {0}              it had not run (or was already undone or released); it never will
--
-- The op record is set to "c" first, so if the undone request is still on its way (a re-send,
-- a slow network) it finds "c" when it arrives and does nothing (sem_acquire.lua). The loader
-- prepends lib/clock.lua and lib/sem_holds.lua to this file.
local done = redis.call('GET', KEYS[3])
if done == 'c' then
  return {0}
end
redis.call('SET', KEYS[3], 'c', 'PX', ARGV[2])
local sem = sem_open(KEYS[1], KEYS[2], ARGV[1], now_ms(), nil)
if not sem then
  return {0}
end
if ARGV[4] == 'reenter' then
  -- A re-entry that ran left its reply in its record; undo its entry once.
  if not done or not sem.held then
    return {0}
  end
  local remaining = sem.entries - 1
  if remaining >= 1 then
    sem_set_entries(KEYS[1], KEYS[2], ARGV[1], remaining)
  else
    -- The other entries were released first: this was the hold's last entry.
    sem_drop(KEYS[1], KEYS[2], ARGV[1], sem.held)
    sem_settle(KEYS[1], KEYS[2])
    sem_publish(KEYS[1], ARGV[3], KEYS[4])
  end
  return {1, remaining}
end
local freed = sem_purge(KEYS[1], KEYS[2], sem)
local permits = sem_drop(KEYS[1], KEYS[2], ARGV[1], sem.live and sem.held)
sem_settle(KEYS[1], KEYS[2])
local unmarked = 0
if KEYS[4] and redis.call('TYPE', KEYS[4])['ok'] == 'zset' then
  unmarked = redis.call('ZREM', KEYS[4], ARGV[1])
end
if KEYS[5] and redis.call('TYPE', KEYS[5])['ok'] == 'hash' then
  redis.call('HDEL', KEYS[5], ARGV[1])
end
if permits + freed + unmarked > 0 then
  -- The waiting writers' key is a channel of its own; a semaphore's queue is not.
  sem_publish(KEYS[1], ARGV[3], (not KEYS[5]) and KEYS[4] or nil)
end
return permits == 0 and {0} or {1, 0}
