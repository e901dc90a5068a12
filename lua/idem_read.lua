-- idem_read.lua: reads an idempotency key's record and whether its runner still holds the
-- key's lock; or, as an operator's "forget", deletes a record whose key nobody holds.
--
-- KEYS[1]  the key's lock hash (prefix{tag}idem:NAME)
-- KEYS[2]  the key's record (prefix{tag}idem-rec:NAME), as idem_begin.lua describes it
-- ARGV[1]  "read", or "forget": delete the record when the lock is free
--
-- Returns  {0, lock_token, pttl}  no record (no run within its retention); lock_token is the
--                           "~token" of the lock hash (0: the lock is free) and pttl the
--                           lock's remaining lease in ms (-1: no expiry; -2: free)
--          {1, RECORD, lock_token, pttl}  the record (RECORD as idem_begin.lua returns it)
--                           and the lock as above: the record's runner holds the lock
--                           exactly when token = lock_token. With "forget" and a free lock,
--                           the record answered is the one just deleted.
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing
--                           modified
--
-- "forget" never deletes under a holder: while the lock is held the record is answered and
-- kept (the caller sees lock_token > 0), since a running request's finish would write the
-- record again anyway and a duplicate could run meanwhile. Commands: HGET, PTTL, DEL (the
-- least-privilege ACL has no HGETALL).
--
-- Uses hash_field() from lib/hash_field.lua, which the loader prepends to this file.
local lock_token, lock_err = hash_field(KEYS[1], '~token', 'lock key')
if lock_token == nil then
  return lock_err
end
local recorded, recorded_err = hash_field(KEYS[2], 'token', 'idempotency record')
if recorded == nil then
  return recorded_err
end
lock_token = tonumber(lock_token or '0')
local pttl = redis.call('PTTL', KEYS[1])
if not recorded then
  return {0, lock_token, pttl}
end
local finished = redis.call('HGET', KEYS[2], 'finished')
local reply = {
  1,
  redis.call('HGET', KEYS[2], 'runner'),
  tonumber(recorded),
  tonumber(redis.call('HGET', KEYS[2], 'started')),
  tonumber(finished or '0'),
  tonumber(redis.call('HGET', KEYS[2], 'failed') or '0'),
  tonumber(redis.call('HGET', KEYS[2], 'final') or '0'),
  finished and (redis.call('HGET', KEYS[2], 'result') or '') or '',
  redis.call('HGET', KEYS[2], 'fingerprint'),
  lock_token,
  pttl,
}
if ARGV[1] == 'forget' and lock_token == 0 then
  redis.call('DEL', KEYS[2])
end
return reply
