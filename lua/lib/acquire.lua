-- lib/acquire.lua: how a plain lock is taken, shared by acquire.lua and acquire_fair.lua
-- (lock_open, lock_grant), handoff.lua and acquire_all.lua (lock_grant). The loader
-- (src/protocol/scripts.rs) prepends it to each, since Redis scripts cannot import.
--
-- lock_open(lock, op, holder, ttl, recorded) makes the checks every acquisition makes before
-- it looks at who else holds the lock: how many of the lock key and the op record `op` exist
-- (one EXISTS of both: on the free path, neither, it is the only read), then the op record
-- (GET) and, when the lock key exists, the holder's count (HGET under redis.pcall: its
-- WRONGTYPE is the type check; TYPE only names the foreign type in the error). Returns the
-- reply the acquisition answers with: {1, token, count, pttl}, a replay (the holder holds the
-- lock: the same request ran before and its reply was lost, or a release granted it; pttl is
-- what is left of the hold's lease, which started before this send and is not renewed by it;
-- a recorded send, `recorded` true, leaves "a" in `op` for ttl ms, NX); {-2} (no hold, but the
-- op record says the acquisition ran or was cancelled); a FENCELOCK_WRONGTYPE error (the lock
-- key is not a hash); the server's own error of the HGET (an ACL refusal) as it is. Else nil
-- and whether the lock key is a hash (another holder's lock, or a fair-handoff reservation);
-- nothing is written then.
--
-- lock_grant(lock, holder, token_text, label, lease, op, ttl) writes a new hold (its token is
-- already in the fence counter: take_token() wrote it, or the caller): the lock hash is
-- {holder: 1, "~token": token} with "~label" when `label` is given, expiring after `lease`
-- ms, and the op record `op` (nil: none) gets "a" for ttl ms. Writes only, none can fail.
local function lock_open(lock, op, holder, ttl, recorded)
  local found = redis.call('EXISTS', lock, op)
  local done = found > 0 and redis.call('GET', op)
  if found == 0 or (found == 1 and done) then
    return done and {-2}, false
  end
  local count = redis.pcall('HGET', lock, holder)
  if type(count) == 'table' then
    return string.sub(count.err, 1, 9) ~= 'WRONGTYPE' and count or done and {-2} or redis.error_reply(
      'FENCELOCK_WRONGTYPE lock key holds a ' .. redis.call('TYPE', lock)['ok'] .. ', not a fencelock hash')
  end
  if count then
    if recorded then
      redis.call('SET', op, 'a', 'PX', ttl, 'NX')
    end
    return {1, tonumber(redis.call('HGET', lock, '~token')), tonumber(count), redis.call('PTTL', lock)}
  end
  return done and {-2}, true
end

local function lock_grant(lock, holder, token_text, label, lease, op, ttl)
  if label then
    redis.call('HSET', lock, holder, '1', '~token', token_text, '~label', label)
  else
    redis.call('HSET', lock, holder, '1', '~token', token_text)
  end
  redis.call('PEXPIRE', lock, lease)
  if op then
    redis.call('SET', op, 'a', 'PX', ttl)
  end
end
