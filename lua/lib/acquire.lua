-- lib/acquire.lua: how a plain lock is taken, shared by acquire.lua and acquire_fair.lua
-- (lock_open, lock_grant), handoff.lua and acquire_all.lua (lock_grant). The loader
-- (src/protocol/scripts.rs) prepends it to each, since Redis scripts cannot import.
--
-- lock_open(lock, op, holder, ttl, recorded) makes the checks every acquisition makes before
-- it looks at who else holds the lock, reading the op record `op` (GET), the lock key's type
-- (TYPE: on the free path the one existence check, and it tells a foreign hash, "held", from
-- a missing key) and, in a hash, the holder's count. Returns the reply the acquisition answers
-- with: {1, token, count, pttl}, a replay (the holder holds the lock: the same request ran
-- before and its reply was lost, or a release granted it; pttl is what is left of the hold's
-- lease, which started before this send and is not renewed by it; a recorded send, `recorded`
-- true, leaves "a" in `op` for ttl ms, NX); {-2} (no hold, but the op record says the acquisition ran or was cancelled); a
-- FENCELOCK_WRONGTYPE error (the lock key is not a hash). Else nil and whether the lock key is
-- a hash (another holder's lock, or a fair-handoff reservation); nothing is written then.
--
-- lock_grant(lock, fence, holder, token_text, label, lease, op, ttl) writes a new hold: the
-- fence counter `fence` gets the token (nil: the caller writes it), the lock hash is
-- {holder: 1, "~token": token} with "~label" when `label` is given, expiring after `lease`
-- ms, and the op record `op` (nil: none) gets "a" for ttl ms. Writes only, none can fail.
local function lock_open(lock, op, holder, ttl, recorded)
  local done = redis.call('GET', op)
  local kind = redis.call('TYPE', lock)['ok']
  local count = kind == 'hash' and redis.call('HGET', lock, holder)
  if count then
    if recorded then
      redis.call('SET', op, 'a', 'PX', ttl, 'NX')
    end
    return {1, tonumber(redis.call('HGET', lock, '~token')), tonumber(count), redis.call('PTTL', lock)}
  end
  if done then
    return {-2}
  end
  if kind ~= 'hash' and kind ~= 'none' then
    return redis.error_reply('FENCELOCK_WRONGTYPE lock key holds a ' .. kind .. ', not a fencelock hash')
  end
  return nil, kind == 'hash'
end

local function lock_grant(lock, fence, holder, token_text, label, lease, op, ttl)
  if fence then
    redis.call('SET', fence, token_text)
  end
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
