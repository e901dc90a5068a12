-- lib/rw.lua: the acquisition of a read-write lock, shared by rw_acquire.lua and
-- rw_read_many.lua; the loader (src/protocol/scripts.rs) prepends it to both, after
-- lib/sem_holds.lua and lib/sem_take.lua (whose functions it uses), since Redis scripts
-- cannot import.
--
-- A read-write lock is a semaphore of RW_LIMIT permits (layout in lib/sem_holds.lua): a writer
-- takes every permit, a reader one; its waiting writers are a zset of their own, holder id ->
-- until when the writer's mark keeps new readers out (server ms), also the writers' channel.
--
-- rw_busy(hash, leases, writers, sem, now, wanted, reading, mode) decides whether an
-- acquisition of `wanted` permits (a writer's: RW_LIMIT; a reader's, `reading`: 1) may go
-- ahead (`sem` opened with the waiting writers: without their key, the common case for
-- readers, it is neither read nor written): drops expired holds (sem_purge) and expired
-- writers' marks, then answers nil when it
-- may; else the acquisition is busy: a writer holds the lock, or (to read) a writer waits, or
-- (to write) readers hold it. Busy, it
-- settles the keys and wakes waiters when its purge freed permits, and answers the
-- ms until the earliest deadline that could end that (a hold's lease, a waiting writer's mark;
-- -1 when none is known) and the earliest deadline among the holds (nil: none).
local RW_LIMIT = 1000000000

local function rw_busy(hash, leases, writers, sem, now, wanted, reading, mode)
  local freed = sem_purge(hash, leases, sem)
  if sem.marks then
    redis.call('ZREMRANGEBYSCORE', writers, '-inf', int_text(now))
  end
  local marked = sem.marks and redis.call('ZRANGE', writers, 0, 0, 'WITHSCORES') or {}
  if sem_used(hash) + wanted <= RW_LIMIT and not (reading and #marked > 0) then
    return nil
  end
  sem_settle(hash, leases)
  local earliest = sem_earliest(hash, leases)
  if freed > 0 then
    sem_publish(hash, mode, writers)
  end
  local until_ms = earliest
  if reading and #marked > 0 and (not until_ms or tonumber(marked[2]) < until_ms) then
    until_ms = tonumber(marked[2])
  end
  return until_ms and (until_ms - now) or -1, earliest
end
