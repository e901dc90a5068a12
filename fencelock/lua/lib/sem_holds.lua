-- lib/sem_holds.lua: shared by the scripts of holds with leases of their own (sem_acquire.lua,
-- sem_release.lua, sem_cancel.lua, sem_renew.lua, rw_acquire.lua, rw_downgrade.lua); the
-- loader (src/protocol/scripts.rs) prepends it to each.
--
-- A semaphore is two keys in one slot (a read-write lock is a semaphore whose writer takes
-- every permit, plus the zset of its waiting writers: rw_acquire.lua):
--   hash  "~limit" -> permits in all, "~used" -> permits held now (the sum over the holds),
--         <holder id> -> "<permits>:<token>", one field per live hold
--         "~entries:<holder id>" -> its entries, only while a hold was entered again through
--         its guard (hold_reenter.lua): at least 2; absent means 1
--   zset  <holder id> -> the hold's lease deadline, in server milliseconds
-- A hold is live while its deadline is in the future by the server clock. Every script that
-- reads or changes the holds first drops the holds whose deadline passed (sem_purge), so a
-- crashed holder's permits come back within its lease without any sweeper. Both keys expire
-- at the latest deadline (sem_settle): a semaphore nobody holds any more disappears, limit
-- included, and nothing stays behind per holder.

-- The server clock in milliseconds (the deadlines' clock).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The server clock in microseconds, as decimal text (a fair queue's order).
local function micros_now()
  local t = redis.call('TIME')
  return string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
end

-- nil when both keys are absent or of the types above; else an error reply (nothing read or
-- written yet).
local function sem_check(hash, leases)
  local hash_kind = redis.call('TYPE', hash)['ok']
  if hash_kind ~= 'hash' and hash_kind ~= 'none' then
    return redis.error_reply('FENCELOCK_WRONGTYPE semaphore key holds a ' .. hash_kind .. ', not a fencelock hash')
  end
  local leases_kind = redis.call('TYPE', leases)['ok']
  if leases_kind ~= 'zset' and leases_kind ~= 'none' then
    return redis.error_reply('FENCELOCK_WRONGTYPE semaphore lease key holds a ' .. leases_kind .. ', not a sorted set')
  end
  return nil
end

-- Removes one hold; returns the permits it had (0 when it was not there).
local function sem_drop(hash, leases, holder)
  redis.call('ZREM', leases, holder)
  local held = redis.call('HGET', hash, holder)
  if not held then
    return 0
  end
  local permits = tonumber(string.match(held, '^(%d+):'))
  redis.call('HDEL', hash, holder, '~entries:' .. holder)
  redis.call('HINCRBY', hash, '~used', -permits)
  return permits
end

-- Drops every hold whose deadline is at or before `now`; returns the permits freed.
local function sem_purge(hash, leases, now)
  local freed = 0
  for _, holder in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now)) do
    freed = freed + sem_drop(hash, leases, holder)
  end
  return freed
end

-- After a change: deletes a semaphore with no hold left, else sets both keys to expire at the
-- latest deadline. Returns the earliest deadline still held (nil when none is).
local function sem_settle(hash, leases)
  local last = redis.call('ZRANGE', leases, -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', hash, leases)
    return nil
  end
  redis.call('PEXPIREAT', hash, last[2])
  redis.call('PEXPIREAT', leases, last[2])
  return tonumber(redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')[2])
end

-- Announces that permits came back, so that waiters go to Redis again: on the hash's channel,
-- and on the waiting writers' channel `writers` of a read-write lock (nil for a semaphore).
local function sem_publish(hash, mode, writers)
  local command = mode == 'sharded' and 'SPUBLISH' or 'PUBLISH'
  redis.call(command, hash, 'released')
  if writers then
    redis.call(command, writers, 'released')
  end
end
