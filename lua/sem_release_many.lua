-- sem_release_many.lua: several releases of holds of one semaphore or read-write lock, by one
-- client, in one script call. Each is answered exactly as sem_release.lua would answer it
-- alone, as if they ran one after another in the order given; what they have in common is
-- done once: the clock, the read of the hash and of the expired holds, the purge, the removal
-- of the holds they end, the settling of the keys and the wake-up.
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
local n = tonumber(ARGV[1])
local f = tonumber(ARGV[4])
if not n or n < 1 or (f ~= 2 and f ~= 3) or #ARGV ~= 4 + 2 * n or #KEYS ~= f + 2 * n then
  return redis.error_reply('FENCELOCK_BADARG sem_release_many.lua: malformed list of releases')
end
local writers = f == 3 and KEYS[3] or nil
local function op_record(i) return KEYS[f + 2 * i - 1] end
local function acquire_record(i) return KEYS[f + 2 * i] end

local now = now_ms()
local sem, err = sem_open(KEYS[1], KEYS[2], nil, now, nil)
if not sem then
  return err
end

-- Each holder's fields and each release's records: one HMGET, one MGET for all of them.
local holders, ops, first_of, again = {}, {}, {}, {}
local wanted, records = {}, {}
for i = 1, n do
  holders[i], ops[i] = ARGV[2 * i + 3], ARGV[2 * i + 4]
  if first_of[ops[i]] then
    again[i] = first_of[ops[i]]
  else
    first_of[ops[i]] = i
  end
  wanted[2 * i - 1], wanted[2 * i] = holders[i], '~entries:' .. holders[i]
  records[2 * i - 1], records[2 * i] = op_record(i), acquire_record(i)
end
local fields = redis.call('HMGET', KEYS[1], unpack(wanted))
local marks = redis.call('MGET', unpack(records))

-- The holds as the releases find them, one after another: per holder its field (false: no
-- live hold) and its entries. Expired holds are dropped before any release looks (as the
-- first release alone would), so a holder whose lease ended holds nothing.
local expired = {}
for _, gone in ipairs(sem.expired) do
  expired[gone] = true
end
sem_purge(KEYS[1], KEYS[2], sem)
local holds = {}
local function hold_of(i)
  local holder = holders[i]
  if holds[holder] == nil then
    local held = fields[2 * i - 1] or false
    if held and FIELD_EXPIRY then
      held = (sem_deadline(KEYS[1], KEYS[2], holder) or 0) > now and held
    elseif held and expired[holder] then
      held = false
    end
    holds[holder] = {held = held, entries = tonumber(fields[2 * i]) or 1}
  end
  return holds[holder]
end

local replies, ended, gone = {}, {}, {}
for i = 1, n do
  local done = marks[2 * i - 1]
  local hold = hold_of(i)
  if again[i] then
    replies[i] = replies[again[i]]
  elseif done then
    replies[i] = {1, tonumber(done)}
  elseif not hold.held then
    replies[i] = marks[2 * i] == 'r:' .. ops[i] and {1, 0} or {-1}
  elseif hold.entries > 1 then
    hold.entries = hold.entries - 1
    sem_set_entries(KEYS[1], KEYS[2], holders[i], hold.entries)
    redis.call('SET', op_record(i), hold.entries, 'PX', ARGV[2])
    replies[i] = {1, hold.entries}
  else
    ended[#ended + 1] = i
    gone[#gone + 1] = hold.held
    hold.held = false
    replies[i] = {1, 0}
  end
end
if #ended == 0 then
  return replies
end

-- The ended holds go together (sem_drop for each, in three commands for all).
local dropped, permits = {}, 0
for k, i in ipairs(ended) do
  dropped[2 * k - 1], dropped[2 * k] = holders[i], '~entries:' .. holders[i]
  permits = permits + tonumber(string.match(gone[k], '^(%d+):'))
end
redis.call('HDEL', KEYS[1], unpack(dropped))
if not FIELD_EXPIRY then
  local gone_holders = {}
  for k, i in ipairs(ended) do
    gone_holders[k] = holders[i]
  end
  redis.call('ZREM', KEYS[2], unpack(gone_holders))
  USED = redis.call('HINCRBY', KEYS[1], '~used', '-' .. int_text(permits))
end
sem_settle(KEYS[1], KEYS[2])
if not (writers and not FIELD_EXPIRY and USED > 0) then
  sem_publish(KEYS[1], ARGV[3], writers)
end
for _, i in ipairs(ended) do
  redis.call('SET', acquire_record(i), 'r:' .. ops[i], 'PX', ARGV[2])
end
return replies
