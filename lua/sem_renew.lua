-- sem_renew.lua: the watchdog's batched renewal of semaphore holds, owner-checked.
--
-- KEYS[2i-1]  semaphore hash i, KEYS[2i] its lease zset (on a cluster, every key of one call
--             is in one slot)
-- ARGV[1]     lease in ms for every hold
-- ARGV[1+i]   holder id of hold i
--
-- Returns  {r1, r2, ...}  ri = 1: hold i is live and its deadline is now ARGV[1] ms from now
--                         (both keys expire no earlier); ri = 0: it is not (its lease ended,
--                         it was released, or a key holds foreign data); nothing changed for it
--
-- A hold whose deadline passed is not revived, even if no script has purged it yet: its
-- permits may already have been counted free by an acquirer. No op record: setting a deadline
-- again is idempotent. A key of another type counts as not held; any error (an ACL refusal)
-- fails the whole call, so that the watchdog retries instead of taking every hold for lost.
-- The loader prepends lib/clock.lua and lib/sem_holds.lua to this file.
local now = now_ms()
local renewed = {}
for i = 1, #ARGV - 1 do
  local hash, leases, holder = KEYS[2 * i - 1], KEYS[2 * i], ARGV[i + 1]
  renewed[i] = 0
  local sem, err = sem_open(hash, leases, holder, now, nil)
  if err and string.sub(err.err, 1, 19) ~= 'FENCELOCK_WRONGTYPE' then
    return err
  end
  if sem and sem.live then
    sem_set_deadline(hash, leases, holder, now + tonumber(ARGV[1]))
    renewed[i] = 1
  end
end
return renewed
