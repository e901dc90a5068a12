-- rw_acquire.lua: take a read-write lock for reading or for writing, with writer preference.
--
-- KEYS[1]  lock hash        (layout in lib/sem_holds.lua: a writer holds every permit,
--                           "~limit" is 1000000000, a reader holds one; also the readers'
--                           channel)
-- KEYS[2]  lease zset       holder id -> deadline in server ms
-- KEYS[3]  waiting writers  zset: holder id of a writer that waits -> until when its mark
--                           keeps new readers out (server ms); also the writers' channel
-- KEYS[4]  fence counter    string: highest token issued in this slot (shared with the locks)
-- KEYS[5]  op record        string, keyed by the holder id: "a" once a recorded send ran, "c"
--                           when it was cancelled (sem_cancel.lua), "r:<op id>" once released;
--                           kept ARGV[5] ms
-- ARGV[1]  holder id        unique per acquisition, never reused
-- ARGV[2]  mode             "r" to read, "w" to write
-- ARGV[3]  lease in ms      positive integer
-- ARGV[4]  "1": a writer that will wait (it marks itself waiting when the lock is busy);
--          anything else: a try, which never marks
-- ARGV[5]  op record lifetime in ms
-- ARGV[6]  pub/sub mode     "sharded" publishes with SPUBLISH, else PUBLISH (when dropping
--                           expired holds freed the lock for others)
-- ARGV[7]  "fields": a lock this creates keeps its deadlines as hash-field expiry (the server
--                           must have HPEXPIREAT); else in the lease zset. An existing lock
--                           keeps its own way (lib/sem_holds.lua)
-- ARGV[8]  "1": record this send, "0": the acquisition's only send so far (acquire.lua ARGV[4]
--          says when a record is needed and why a first send needs none)
-- ARGV[9]  label            optional: an operator's tag for the hold (a request or trace id),
--                           kept in the hold's field while it lasts ("<permits>:<token>:<label>",
--                           lib/sem_holds.lua); absent: the field is "<permits>:<token>"
--
-- Returns  {1, token}       acquired
--          {1, token, left} a replay: this holder already holds it, `left` ms of its lease
--                           remain (not renewed by this send); nothing changes, its label
--                           included. A writer's token is greater than every token issued
--                           before in the slot; so is a reader's, which is also below every
--                           later writer's: it places the read between two writes
--          {0, wait_ms}     busy: a writer holds it, or (to read) a writer waits, or (to
--                           write) readers hold it. wait_ms: until the earliest deadline that
--                           could end that (a hold's lease, a waiting writer's mark); -1 when
--                           none is known
--          {-2}             this acquisition was cancelled, or it ran and its hold has ended
--                           since: a late duplicate of the request; nothing done
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing modified
--          FENCELOCK_OVERFLOW   the next token would not be exact in a Lua double; nothing modified
--
-- Writer preference: a waiting writer's mark stops new readers; readers already inside keep
-- their holds until they release or their leases end. A mark lasts until the earliest
-- deadline among the holds plus the writer's lease, and every attempt of the writer sets it
-- again, so it outlives the writer's next attempt (which its waiting timer makes at that
-- deadline at the latest) but not a writer that died: a crashed writer keeps readers out for
-- at most that long. A writer that gives up removes its mark (sem_cancel.lua).
--
-- Each read of rw_read_many.lua is answered by the same functions: sem_again() of
-- lib/sem_take.lua and rw_busy() of lib/rw.lua, which the loader prepends to this file after
-- lib/clock.lua, lib/sem_holds.lua and lib/next_token.lua.
--
-- A lock nobody holds or waits for, with no op record of this acquisition, is seen by
-- sem_open's one EXISTS of those keys after its HMGET: none of them is read then (`fresh`);
-- when any exists, every read and type check below runs. A free lock takes its token with
-- take_token() (sem_token), which puts back a counter it refuses, so an error still leaves
-- nothing changed.
local clock = redis.call('TIME')
local now = now_ms(clock)
local sem, err = sem_open(KEYS[1], KEYS[2], ARGV[1], now, ARGV[7], KEYS[3], nil, {KEYS[5]})
if not sem then
  return err
end
local fresh = sem.fresh
local again = sem_again(sem, not fresh and redis.call('GET', KEYS[5]), KEYS[5], ARGV[5], ARGV[8] == '1')
if again then
  if again[1] == 1 then
    -- A replay: what is left of the hold's lease, which began before this send.
    again[3] = math.max((sem_deadline(KEYS[1], KEYS[2], ARGV[1]) or now) - now, 0)
  end
  return again
end

-- A free lock is granted whatever the mode: its counter is taken at once (sem_token).
local token, token_text = sem_token(KEYS[4], clock, fresh)
if not token then
  return token_text -- the error reply
end

local writing = ARGV[2] == 'w'
local wanted = writing and RW_LIMIT or 1
local wait_ms, earliest = rw_busy(KEYS[1], KEYS[2], KEYS[3], sem, now, wanted, not writing, ARGV[6])
if wait_ms then
  if writing and ARGV[4] == '1' then
    redis.call('ZADD', KEYS[3], (earliest or now) + tonumber(ARGV[3]), ARGV[1])
    local latest = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', KEYS[3], latest[2])
  end
  return {0, wait_ms}
end

if not fresh then
  redis.call('SET', KEYS[4], token_text)
end
sem_grant(KEYS[1], KEYS[2], ARGV[1], wanted, token_text, ARGV[9], RW_LIMIT, now + tonumber(ARGV[3]))
if sem.marks then
  redis.call('ZREM', KEYS[3], ARGV[1])
end
if ARGV[8] == '1' then
  redis.call('SET', KEYS[5], 'a', 'PX', ARGV[5])
end
return {1, token}
