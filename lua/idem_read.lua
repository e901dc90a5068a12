-- idem_read.lua: reads an idempotency key's record and whether its runner still holds the
-- key's lock; or, as an operator's "forget", deletes a record whose key nobody holds.
--
-- KEYS[1]  the key's lock hash (prefix{tag}idem:NAME)
-- KEYS[2]  the key's record (prefix{tag}idem-rec:NAME), as idem_begin.lua describes it
-- ARGV[1]  "read", or "forget": delete the record when the lock is free
-- ARGV[2]  with "forget", optional: the token of the run the caller means to forget (a decimal
--          token; "" or absent: whichever run the record names); a record of another run
--          (one that took the key over since the caller looked) is answered and kept
--
-- Returns  {0, lock_token, pttl}  no record (no run within its retention); lock_token is the
--                           "~token" of the lock hash (0: the lock is free) and pttl the
--                           lock's remaining lease in ms (-1: no expiry; -2: free)
--          {1, RECORD, lock_token, pttl}  the record (RECORD as idem_begin.lua returns it)
--                           and the lock as above: the record's runner holds the lock
--                           exactly when token = lock_token. With "forget", a free lock and
--                           the run ARGV[2] names (if any), the record answered is the one
--                           just deleted.
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing
--                           modified
--
-- "forget" never deletes under a holder: while the lock is held the record is answered and
-- kept (the caller sees lock_token > 0), since a running request's finish would write the
-- record again anyway and a duplicate could run meanwhile. Commands: HGET, PTTL, DEL (the
-- least-privilege ACL has no HGETALL).
--
-- Uses run_read() (lib/run_record.lua) and idem_record() (lib/idem_record.lua), which the
-- loader prepends to this file after lib/calls.lua and lib/clock.lua.
return run_read(KEYS[1], KEYS[2], 'idempotency record', function(key, code, recorded, lock_token, pttl)
  local reply = idem_record(key, code, recorded, lock_token, pttl)
  local expected = ARGV[2] ~= nil and ARGV[2] ~= '' and tonumber(ARGV[2])
  if ARGV[1] == 'forget' and lock_token == 0 and (not expected or tonumber(recorded) == expected) then
    redis.call('DEL', KEYS[2])
  end
  return reply
end)
