-- sem_release_many.lua: several releases of holds of one semaphore or read-write lock, by one
-- client, in one script call. Each is answered exactly as sem_release.lua would answer it
-- alone, as if they ran one after another in the order given, by the same function
-- (sem_leave of lib/sem_give.lua, prepended by the loader after lib/clock.lua and
-- lib/sem_holds.lua); what they have in common is done once: the clock, the read of the hash
-- and of the expired holds (sem_open for every holder), the purge, the removal of the holds
-- they end (sem_drop_all), the settling of the keys and the wake-up.
--
-- KEYS[1]        semaphore hash   (layout in lib/sem_holds.lua; also its release channel)
-- KEYS[2]        lease zset
-- KEYS[3]        a read-write lock's waiting writers (zset; also their channel), when ARGV[4]
--                is "3"; absent for a semaphore
-- then per release i, two keys from KEYS[f + 2 * i - 1] (f = ARGV[4]): its op record
--                (sem_release.lua KEYS[3]) and its holder's acquire record (KEYS[4])
-- ARGV[1]        n, the number of releases, at least 1
-- ARGV[2]        op record lifetime in ms
-- ARGV[3]        pub/sub mode     "sharded" publishes with SPUBLISH, else PUBLISH
-- ARGV[4]        f, the number of keys before the releases': "2" (a semaphore) or "3" (a
--                read-write lock)
-- then per release i, two arguments from ARGV[2 * i + 3]: its holder id and its op id. An op
--                id given again (a release re-sent while its first send waits in the same
--                call) is answered as its first: the replay it would be after it
--
-- Returns  an array of n replies in the order of the releases, each sem_release.lua's for it:
--          {1, n}  left once, n entries remain; {1, 0} released, or a replay of this same
--          release; {-1} the holder holds nothing here
-- Errors   FENCELOCK_WRONGTYPE  the hash or a zset holds a value this protocol did not write;
--                               nothing modified
--          FENCELOCK_BADARG     the list of releases is malformed; nothing done
--          A release's op record or acquire record of another type reads as absent here
--          (MGET), where sem_release.lua alone raises WRONGTYPE and writes nothing: the release
--          goes ahead, and one that leaves an entry writes its record over that value.
--
-- The releases of one holder (a hold entered again through its guard) apply in order: the
-- first leaves an entry, a later one ends the hold. A call wakes the waiters once when
-- its releases freed permits, where sem_release.lua alone publishes once per freeing release
-- (a read-write lock on the lease-zset path: only when no hold is left, as there).
-- The holds a grouped release ended, dropped together: `holds` lists holds as sem_open gives
-- them (each with its field `held`). As sem_drop for each, in one HDEL, ZREM and HINCRBY; none
-- when they were the last holds (sem_empties: the settling that follows deletes the keys).
local function sem_drop_all(hash, leases, holds)
  local holders, fields, permits = {}, {}, 0
  for k, hold in ipairs(holds) do
    holders[k] = hold.holder
    fields[2 * k - 1], fields[2 * k] = hold.holder, '~entries:' .. hold.holder
    permits = permits + tonumber(string.match(hold.held, '^(%d+):'))
  end
  if sem_empties(permits) then
    return
  end
  redis.call('HDEL', hash, unpack(fields))
  if not FIELD_EXPIRY then
    redis.call('ZREM', leases, unpack(holders))
    USED = redis.call('HINCRBY', hash, '~used', int_text(-permits))
  end
end

local n = tonumber(ARGV[1])
local f = tonumber(ARGV[4])
if not n or n < 1 or (f ~= 2 and f ~= 3) or #ARGV ~= 4 + 2 * n or #KEYS ~= f + 2 * n then
  return redis.error_reply('FENCELOCK_BADARG sem_release_many.lua: malformed list of releases')
end
local writers = f == 3 and KEYS[3] or nil

-- Every holder's fields in sem_open's HMGET, every release's records in one MGET: release i's
-- op record KEYS[f + 2 * i - 1] (read as marks[2 * i - 1]) and its holder's acquire record
-- KEYS[f + 2 * i] (marks[2 * i]).
local holders, ops, first_of = {}, {}, {}
for i = 1, n do
  holders[i], ops[i] = ARGV[2 * i + 3], ARGV[2 * i + 4]
  first_of[ops[i]] = first_of[ops[i]] or i
end
local sem, err = sem_open(KEYS[1], KEYS[2], holders, now_ms(), nil, nil, true)
if not sem then
  return err
end
local marks = redis.call('MGET', unpack(KEYS, f + 1, f + 2 * n))

-- The releases one after another, each on its holder's hold as the ones before left it: the
-- releases of one holder (a hold entered again through its guard) apply in order. Expired
-- holds are dropped before any release looks, as the first release alone would drop them.
sem_purge(KEYS[1], KEYS[2], sem)
local replies, ended = {}, {}
for i = 1, n do
  -- An op id given again is answered as its first.
  local hold = sem.holds[holders[i]]
  replies[i] = replies[first_of[ops[i]]]
    or sem_leave(KEYS[1], KEYS[2], sem, hold, marks[2 * i - 1], KEYS[f + 2 * i - 1], ARGV[2])
  if replies[i] then
    -- answered
  elseif hold.live then
    ended[#ended + 1] = {holder = hold.holder, held = hold.held, op = ops[i], mark = KEYS[f + 2 * i]}
    hold.live = false
    replies[i] = {1, 0}
  else
    replies[i] = marks[2 * i] == 'r:' .. ops[i] and {1, 0} or {-1}
  end
end
if #ended == 0 then
  return replies
end

-- The ended holds go together (one HDEL, ZREM and HINCRBY for them all).
sem_drop_all(KEYS[1], KEYS[2], ended)
sem_settle(KEYS[1], KEYS[2])
if not (writers and not FIELD_EXPIRY and USED > 0) then
  sem_publish(KEYS[1], ARGV[3], writers)
end
for _, hold in ipairs(ended) do
  redis.call('SET', hold.mark, 'r:' .. hold.op, 'PX', ARGV[2])
end
return replies
