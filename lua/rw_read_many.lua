-- rw_read_many.lua: several read acquisitions of one read-write lock, by one client, in one
-- script call. Each is answered exactly as rw_acquire.lua would answer it alone (mode "r"), as
-- if they ran one after another in the order given, by the same functions (sem_again,
-- rw_busy; the loader prepends lib/clock.lua, lib/sem_holds.lua, lib/next_token.lua,
-- lib/sem_take.lua and lib/rw.lua to this file); what they have in common is done once: the
-- clock, the read of the hash, of every reader's field and of the expired holds (sem_open),
-- the waiting writers' check (rw_busy), the fence counter, the writes of the grants (one
-- sem_grant_ones for them all) and the keys' expiry. A read alone costs a script call of about 10
-- server commands; each further read in the call costs a field, a member and a few lines of
-- Lua.
--
-- KEYS[1]    lock hash        (layout in lib/sem_holds.lua; a reader holds one permit of
--                             1000000000)
-- KEYS[2]    lease zset       holder id -> deadline in server ms
-- KEYS[3]    waiting writers  zset (rw_acquire.lua): a mark here keeps new readers out
-- KEYS[4]    fence counter    string: highest token issued in this slot
-- KEYS[4+i]  op record of read i, keyed by its holder id (rw_acquire.lua KEYS[5]), i = 1..n
-- ARGV[1]    n                the number of reads, at least 1
-- ARGV[2]    lease in ms      every read's (positive integer)
-- ARGV[3]    op record lifetime in ms
-- ARGV[4]    pub/sub mode     "sharded" publishes with SPUBLISH, else PUBLISH
-- ARGV[5]    "fields": a lock this creates keeps its deadlines as hash-field expiry
--                             (rw_acquire.lua ARGV[7])
-- then per read i, three arguments from ARGV[3 * i + 3]:
--            its holder id (unique per acquisition; one given again, a read re-sent while its
--            first send waits in the same call, is answered as its first: the replay it
--            would be after it);
--            "1": record this send, "0": its only send so far (rw_acquire.lua ARGV[8]);
--            its label, "" for none (a label has at least one byte)
--
-- Returns  an array of n replies in the order of the reads, each rw_acquire.lua's for it:
--          {1, token}   held (fresh, or a replay: the holder holds it already; nothing
--                       changes). The fresh holds' tokens are consecutive, in the reads'
--                       order, each greater than every token issued before in the slot
--          {0, wait_ms} busy (a writer holds it or waits for it): every fresh read of the
--                       call is busy, with the same wait_ms (-1 when unknown)
--          {-2}         cancelled, or it ran and its hold has ended since: nothing done
--          or, for a fresh read that could not be given a token, the error as its message
--          (a string, as batch.lua gives one: "FENCELOCK_OVERFLOW ..."); nothing of it done
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write (every read
--                               shares the keys); nothing modified. An op record key of
--                               another type reads as absent here (MGET), where rw_acquire.lua
--                               alone refuses it, and a fresh recorded read writes its record
--                               over it; those keys are the protocol's own
--          FENCELOCK_BADARG     the list of reads is malformed (a client bug); nothing done
-- New holds of one permit each, all until `deadline`: `grants` lists {holder, token_text,
-- label} (label nil: none). As sem_grant for each, in one HSET and one ZADD on the lease-zset
-- path (below).
local function sem_grant_ones(hash, leases, grants, limit, deadline)
  if FIELD_EXPIRY then
    for _, grant in ipairs(grants) do
      sem_grant(hash, leases, grant[1], 1, grant[2], grant[3], limit, deadline)
    end
    return
  end
  USED = USED + #grants
  local fields, members = {}, {}
  local deadline_text = int_text(deadline)
  for k, grant in ipairs(grants) do
    fields[2 * k - 1], fields[2 * k] = grant[1], sem_hold_value(1, grant[2], grant[3])
    members[2 * k - 1], members[2 * k] = deadline_text, grant[1]
  end
  fields[#fields + 1], fields[#fields + 2] = '~used', int_text(USED)
  if RECORDED_LIMIT ~= limit then
    fields[#fields + 1], fields[#fields + 2] = '~limit', int_text(limit)
    RECORDED_LIMIT = limit
  end
  local until_text = sem_next_until(deadline)
  if until_text then
    fields[#fields + 1], fields[#fields + 2] = '~until', until_text
  end
  redis.call('HSET', hash, unpack(fields))
  redis.call('ZADD', leases, unpack(members))
  sem_expire_keys(hash, leases, until_text)
end

local n = tonumber(ARGV[1])
if not n or n < 1 or #ARGV ~= 5 + 3 * n or #KEYS ~= 4 + n then
  return redis.error_reply('FENCELOCK_BADARG rw_read_many.lua: malformed list of reads')
end
local function recorded(i) return ARGV[3 * i + 4] == '1' end

-- Each read's own hold field in sem_open's HMGET, every op record in one MGET.
local holders, first_of = {}, {}
for i = 1, n do
  holders[i] = ARGV[3 * i + 3]
  first_of[holders[i]] = first_of[holders[i]] or i
end
local clock = redis.call('TIME')
local now = now_ms(clock)
local sem, err = sem_open(KEYS[1], KEYS[2], holders, now, ARGV[5], KEYS[3])
if not sem then
  return err
end
local records = redis.call('MGET', unpack(KEYS, 5, 4 + n))

-- Each read as rw_acquire.lua's sem_again() answers it, nil for a fresh one (its record, for a
-- replay, written at the end: a foreign counter below fails the whole call, nothing written).
-- A holder given again is answered as its first, at the end.
local replies, fresh, granted = {}, {}, {}
for i = 1, n do
  if first_of[holders[i]] == i then
    replies[i] = sem_again(sem.holds[holders[i]], records[i])
    fresh[#fresh + 1] = not replies[i] and i or nil
  end
end

-- As rw_acquire.lua: the counter is read and checked before the first write. A foreign
-- counter fails the whole call (the reads share it); another refusal fails the fresh reads.
local token, token_text
if #fresh > 0 then
  token, token_text = next_token(KEYS[4], clock)
  if not token and string.sub(token_text.err, 1, 19) == 'FENCELOCK_WRONGTYPE' then
    return token_text
  end
  if token and token + #fresh - 1 >= 9007199254740992 then
    token, token_text = nil, {err = 'FENCELOCK_OVERFLOW fence counter reached 2^53'}
  end
end
local wait_ms = token and rw_busy(KEYS[1], KEYS[2], KEYS[3], sem, now, 1, true, ARGV[4])
if wait_ms or not token then
  for _, i in ipairs(fresh) do
    replies[i] = wait_ms and {0, wait_ms} or token_text.err
  end
else
  -- Consecutive tokens in the reads' order. A reader is never in the waiting writers' zset,
  -- so nothing is removed from it (rw_acquire.lua removes the caller's mark, which only a
  -- writer has).
  local grants = {}
  for k, i in ipairs(fresh) do
    local label = ARGV[3 * i + 5]
    grants[k] = {holders[i], int_text(token + k - 1), label ~= '' and label or nil}
    replies[i] = {1, token + k - 1}
    granted[i] = true
  end
  redis.call('SET', KEYS[4], int_text(token + #fresh - 1))
  sem_grant_ones(KEYS[1], KEYS[2], grants, RW_LIMIT, now + tonumber(ARGV[2]))
  for _, i in ipairs(fresh) do
    if recorded(i) then
      redis.call('SET', KEYS[4 + i], 'a', 'PX', ARGV[3])
    end
  end
end
-- A recorded send of a read that holds (a replay, or a holder given again after its first)
-- leaves "a" in its record, NX, as sem_again() does for rw_acquire.lua.
for i = 1, n do
  replies[i] = replies[first_of[holders[i]]]
  if recorded(i) and not granted[i] and type(replies[i]) == 'table' and replies[i][1] == 1 then
    redis.call('SET', KEYS[4 + i], 'a', 'PX', ARGV[3], 'NX')
  end
end
return replies
