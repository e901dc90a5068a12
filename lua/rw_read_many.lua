-- rw_read_many.lua: several read acquisitions of one read-write lock, by one client, in one
-- script call. Each is answered exactly as rw_acquire.lua would answer it alone (mode "r"), as
-- if they ran one after another in the order given; what they have in common is done once:
-- the clock, the read of the hash and of the expired holds, the waiting writers' check, the
-- fence counter and the keys' expiry. A read alone costs a script call of about 10 server
-- commands; each further read in the call costs a field, a member and a few lines of Lua.
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
local LIMIT = 1000000000
local n = tonumber(ARGV[1])
if not n or n < 1 or #ARGV ~= 5 + 3 * n or #KEYS ~= 4 + n then
  return redis.error_reply('FENCELOCK_BADARG rw_read_many.lua: malformed list of reads')
end
local function holder_of(i) return ARGV[3 * i + 3] end
local function recorded(i) return ARGV[3 * i + 4] == '1' end
local function label_of(i)
  local label = ARGV[3 * i + 5]
  return label ~= '' and label or nil
end

local clock = redis.call('TIME')
local now = now_ms(clock)
local sem, err = sem_open(KEYS[1], KEYS[2], nil, now, ARGV[5])
if not sem then
  return err
end
local marks_kind = redis.call('TYPE', KEYS[3])['ok']
if marks_kind ~= 'zset' and marks_kind ~= 'none' then
  return redis.error_reply('FENCELOCK_WRONGTYPE waiting writers key holds a ' .. marks_kind .. ', not a sorted set')
end

-- Each read's own hold field and op record: one HMGET, one MGET for all of them. A hold is live
-- when its field is there and its deadline has not passed (sem_open for one holder).
local holders, first_of, again = {}, {}, {}
for i = 1, n do
  holders[i] = holder_of(i)
  if first_of[holders[i]] then
    again[i] = first_of[holders[i]]
  else
    first_of[holders[i]] = i
  end
end
local fields = redis.call('HMGET', KEYS[1], unpack(holders))
local records = redis.call('MGET', unpack(KEYS, 5, 4 + n))
local expired = {}
for _, gone in ipairs(sem.expired) do
  expired[gone] = true
end
local function live(i)
  if not fields[i] then
    return false
  end
  if FIELD_EXPIRY then
    return (sem_deadline(KEYS[1], KEYS[2], holders[i]) or 0) > now
  end
  return not expired[holders[i]]
end

local replies = {}
local replays, fresh = {}, {}
for i = 1, n do
  if again[i] then
    -- answered below, once its first is
  elseif live(i) then
    local _, token_text = sem_hold_parse(fields[i])
    replays[#replays + 1] = i
    replies[i] = {1, tonumber(token_text)}
  elseif records[i] then
    replies[i] = {-2}
  else
    fresh[#fresh + 1] = i
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
  if not token then
    for _, i in ipairs(fresh) do
      replies[i] = token_text.err
    end
    fresh = {}
  end
end
for _, i in ipairs(replays) do
  if recorded(i) then
    redis.call('SET', KEYS[4 + i], 'a', 'PX', ARGV[3], 'NX')
  end
end
-- A holder given again is answered as its first; a replay of a hold records as above.
local function answer_again()
  for i = 1, n do
    if again[i] then
      replies[i] = replies[again[i]]
      if recorded(i) and type(replies[i]) == 'table' and replies[i][1] == 1 then
        redis.call('SET', KEYS[4 + i], 'a', 'PX', ARGV[3], 'NX')
      end
    end
  end
  return replies
end
if #fresh == 0 then
  return answer_again()
end
local last = token + #fresh - 1

local freed = sem_purge(KEYS[1], KEYS[2], sem)
local marks = marks_kind == 'zset'
if marks then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', int_text(now))
end
local used = sem_used(KEYS[1])
local marked = marks and redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES') or {}
if used + 1 > LIMIT or #marked > 0 then
  sem_settle(KEYS[1], KEYS[2])
  local until_ms = sem_earliest(KEYS[1], KEYS[2])
  if freed > 0 then
    sem_publish(KEYS[1], ARGV[4], KEYS[3])
  end
  if #marked > 0 then
    local mark = tonumber(marked[2])
    if not until_ms or mark < until_ms then
      until_ms = mark
    end
  end
  for _, i in ipairs(fresh) do
    replies[i] = {0, until_ms and (until_ms - now) or -1}
  end
  return answer_again()
end

-- A reader is never in the waiting writers' zset, so nothing is removed from it (rw_acquire.lua
-- removes the caller's mark, which only a writer has).
redis.call('SET', KEYS[4], int_text(last))
local grants = {}
for k, i in ipairs(fresh) do
  grants[k] = {holders[i], int_text(token + k - 1), label_of(i)}
  replies[i] = {1, token + k - 1}
end
sem_grant_ones(KEYS[1], KEYS[2], grants, LIMIT, now + tonumber(ARGV[2]))
for _, i in ipairs(fresh) do
  if recorded(i) then
    redis.call('SET', KEYS[4 + i], 'a', 'PX', ARGV[3])
  end
end
return answer_again()
