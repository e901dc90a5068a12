-- job_read.lua: reads a job's newest tick record and whether its runner still holds the job's
-- lock. Read-only.
--
-- KEYS[1]  the job's lock hash (prefix{tag}job:NAME)
-- KEYS[2]  the job's tick record (prefix{tag}job-tick:NAME), as job_begin.lua describes it
--
-- Returns  {0, lock_token, pttl}  no record (no tick begun within its retention); lock_token
--                           is the "~token" of the lock hash (0: the lock is free) and pttl
--                           the lock's remaining lease in ms (-1: no expiry; -2: free)
--          {1, tick, runner, token, started, finished, failed, lock_token, pttl}  the record
--                           (finished and failed 0 unless set) and the lock as above: the
--                           record's runner holds the lock exactly when token = lock_token
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write
--
-- Commands: HGET, PTTL (the least-privilege ACL has no HGETALL).
--
-- Uses run_read() and run_fields() (lib/run_record.lua), which the loader prepends to this
-- file after lib/calls.lua and lib/clock.lua.
return run_read(KEYS[1], KEYS[2], 'tick record', function(recorded, lock_token, pttl)
  return {
    1,
    tonumber(redis.call('HGET', KEYS[2], 'tick')),
    run_fields(KEYS[2], recorded, lock_token, pttl),
  }
end)
