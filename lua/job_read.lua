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
-- Uses hash_field() from lib/hash_field.lua, which the loader prepends to this file.
local lock_token, lock_err = hash_field(KEYS[1], '~token', 'lock key')
if lock_token == nil then
  return lock_err
end
local recorded, recorded_err = hash_field(KEYS[2], 'token', 'tick record')
if recorded == nil then
  return recorded_err
end
lock_token = tonumber(lock_token or '0')
local pttl = redis.call('PTTL', KEYS[1])
if not recorded then
  return {0, lock_token, pttl}
end
return {
  1,
  tonumber(redis.call('HGET', KEYS[2], 'tick')),
  redis.call('HGET', KEYS[2], 'runner'),
  tonumber(recorded),
  tonumber(redis.call('HGET', KEYS[2], 'started')),
  tonumber(redis.call('HGET', KEYS[2], 'finished') or '0'),
  tonumber(redis.call('HGET', KEYS[2], 'failed') or '0'),
  lock_token,
  pttl,
}
