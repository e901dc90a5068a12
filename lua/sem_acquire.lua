-- sem_acquire.lua: take permits of a semaphore for a new hold and issue its fencing token.
--
-- KEYS[1]  semaphore hash   (layout in lib/sem_holds.lua; also its release channel)
-- KEYS[2]  lease zset       holder id -> deadline in server ms
-- KEYS[3]  fence counter    string: highest token issued in this slot (shared with the locks)
-- KEYS[4]  op record        string, keyed by the holder id: "a" once a recorded send ran, "c"
--                           when it was cancelled (sem_cancel.lua), "r:<op id>" once released;
--                           kept ARGV[5] ms
-- ARGV[1]  holder id        unique per acquisition, never reused
-- ARGV[2]  permits wanted   positive integer
-- ARGV[3]  limit            permits in all, used when the semaphore has none recorded (first
--                           use, or every earlier hold ended); a recorded limit wins
-- ARGV[4]  lease in ms      positive integer
-- ARGV[5]  op record lifetime in ms
-- ARGV[6]  pub/sub mode     "sharded" publishes with SPUBLISH, else PUBLISH
-- KEYS[5]  queue            fair mode only (a fair-handoff client): zset of the waiting
--                           acquisitions, holder id -> server time (µs) of its first busy
--                           attempt
-- KEYS[6]  waiting          fair mode only: hash, holder id -> "<permits>:<deadline ms>": what
--                           each queued acquisition asks for, and until when its entry lives
-- ARGV[7]  "1": the caller will wait (fair mode: a busy attempt queues it); else a try
-- ARGV[8]  "fields": a semaphore this creates keeps its deadlines as hash-field expiry (the
--                           server must have HPEXPIREAT); else in the lease zset. An existing
--                           semaphore keeps its own way (lib/sem_holds.lua)
-- ARGV[9]  "1": record this send, "0": the acquisition's only send so far (acquire.lua ARGV[4]
--          says when a record is needed and why a first send needs none)
-- ARGV[10] label            optional: an operator's tag for the hold (a request or trace id),
--                           kept in the hold's field while it lasts ("<permits>:<token>:<label>",
--                           lib/sem_holds.lua); absent: the field is "<permits>:<token>"
--
-- Returns  {1, token, permits, limit, free}
--                           acquired: the hold takes `permits` until its lease ends; `free`
--                           permits are left
--          {1, token, permits, limit, free, left}
--                           a replay: this holder already holds them (the same request ran
--                           before and its reply was lost, or a release granted them); `left`
--                           ms of its lease remain (not renewed by this send); nothing
--                           changes, the hold keeps the label it was granted with
--          {0, wait_ms, free, limit}
--                           too few permits free; wait_ms: until the earliest lease of a
--                           holder ends (when permits may come back without a release)
--          {-2}             this acquisition was cancelled, or it ran and its hold has ended
--                           since: a late duplicate of the request; nothing done
--          {-3, limit}      more permits wanted than the semaphore has in all; nothing held
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing modified
--          FENCELOCK_OVERFLOW   the next token would not be exact in a Lua double; nothing modified
--
-- Expired holds are dropped first (sem_purge); when that frees permits that this acquisition
-- leaves free, it publishes on KEYS[1] so that other waiters try again.
--
-- Fair mode (KEYS[5] and KEYS[6] given): the oldest live queued acquisition, the head, is
-- protected: any other acquisition is granted only if it leaves the head's permits free, so a
-- request for many permits is not starved by a stream of small ones. An entry lives until the
-- earliest deadline among the holds plus the waiter's lease and is set again by every attempt
-- of its waiter, so it outlives the waiter's next attempt but not a waiter that died; a waiter
-- that gives up takes it out (sem_cancel.lua). A head that wins with permits left publishes,
-- so the acquisitions it held back try again. The token is
-- max(counter + 1, server TIME in microseconds) (lib/next_token.lua). A replay or a late copy
-- is told apart by sem_again() and the hold written by sem_grant(), as in rw_acquire.lua: of
-- lib/sem_take.lua, which the loader prepends to this file after lib/clock.lua,
-- lib/sem_holds.lua and lib/next_token.lua.
--
-- A semaphore nobody holds, with no op record of this acquisition and no queue, is seen by
-- sem_open's one EXISTS of those keys after its HMGET: none of them is read then (`fresh`);
-- when any exists, every read and type check below runs. A free semaphore takes its token
-- with take_token() (sem_token), which puts back a counter it refuses, so an error still
-- leaves nothing changed.
local clock = redis.call('TIME')
local now = now_ms(clock)
local sem, err = sem_open(KEYS[1], KEYS[2], ARGV[1], now, ARGV[8], nil, nil, {KEYS[4], unpack(KEYS, 5)})
if not sem then
  return err
end
local fresh = sem.fresh
local fair = KEYS[5] ~= nil
-- Fair mode: the queue (KEYS[5], a zset) and its entries (KEYS[6], a hash) are type-checked.
for k = 5, fair and not fresh and 6 or 4 do
  local kind, queue_err = sem_typed(KEYS[k], k == 5 and 'zset' or 'hash', 'semaphore queue key')
  if not kind then
    return queue_err
  end
end
local again, permits = sem_again(sem, not fresh and redis.call('GET', KEYS[4]), KEYS[4], ARGV[5], ARGV[9] == '1')
if again then
  if permits then
    -- A replay: what is left of the hold's lease, which began before this send.
    local left = (sem_deadline(KEYS[1], KEYS[2], ARGV[1]) or now) - now
    again[3], again[4], again[5] = permits, sem.limit, sem.limit - sem_used(KEYS[1])
    again[6] = math.max(left, 0)
  end
  return again
end

-- A free semaphore grants what its limit allows: its counter is taken at once (sem_token).
local taken = fresh and tonumber(ARGV[2]) <= tonumber(ARGV[3])
local token, token_text = sem_token(KEYS[3], clock, taken)
if not token then
  return token_text -- the error reply
end

local freed = sem_purge(KEYS[1], KEYS[2], sem)
local limit = sem.limit or tonumber(ARGV[3])
local used = sem_used(KEYS[1])
local wanted = tonumber(ARGV[2])
-- Fair mode: drop dead queue entries; the first live one is the head.
local head, head_need, last_entry = nil, 0, 0
if fair then
  for _, waiter in ipairs(redis.call('ZRANGE', KEYS[5], 0, -1)) do
    local need, until_ms = string.match(redis.call('HGET', KEYS[6], waiter) or '', '^(%d+):(%d+)$')
    if not need or tonumber(until_ms) <= now then
      redis.call('ZREM', KEYS[5], waiter)
      redis.call('HDEL', KEYS[6], waiter)
    else
      last_entry = math.max(last_entry, tonumber(until_ms))
      if not head then
        head, head_need = waiter, waiter ~= ARGV[1] and tonumber(need) or 0
      end
    end
  end
end
if wanted > limit or used + wanted + head_need > limit then
  sem_settle(KEYS[1], KEYS[2])
  local earliest = sem_earliest(KEYS[1], KEYS[2])
  if freed > 0 then
    sem_publish(KEYS[1], ARGV[6], nil)
  end
  if wanted > limit then
    return {-3, limit}
  end
  if fair and ARGV[7] == '1' then
    local until_ms = (earliest or now) + tonumber(ARGV[4])
    redis.call('ZADD', KEYS[5], 'NX', int_text(micros(clock)), ARGV[1])
    redis.call('HSET', KEYS[6], ARGV[1], wanted .. ':' .. until_ms)
    last_entry = math.max(last_entry, until_ms)
    redis.call('PEXPIREAT', KEYS[5], last_entry)
    redis.call('PEXPIREAT', KEYS[6], last_entry)
  end
  return {0, earliest and (earliest - now) or -1, limit - used, limit}
end

if not taken then
  redis.call('SET', KEYS[3], token_text)
end
sem_grant(KEYS[1], KEYS[2], ARGV[1], wanted, token_text, ARGV[10], limit, now + tonumber(ARGV[4]))
if ARGV[9] == '1' then
  redis.call('SET', KEYS[4], 'a', 'PX', ARGV[5])
end
local free = limit - used - wanted
if fair then
  redis.call('ZREM', KEYS[5], ARGV[1])
  redis.call('HDEL', KEYS[6], ARGV[1])
end
if (freed > 0 or (head and head == ARGV[1])) and free > 0 then
  sem_publish(KEYS[1], ARGV[6], nil)
end
return {1, token, wanted, limit, free}
