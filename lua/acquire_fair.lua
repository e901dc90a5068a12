-- acquire_fair.lua: acquire.lua for clients in fair-handoff mode (LockClientBuilder::fair_handoff).
-- A waiting client that finds the lock held joins the lock's queue of clients; the release that
-- frees the lock (release_fair.lua) reserves it for the first queued client, and only that
-- client's attempt may claim the reservation. The default mode never runs this script.
--
-- KEYS[1]  lock hash        fields: <holder id> -> re-entry count, "~token" -> fencing token,
--                           "~label" -> the acquisition's label (only when it was given one);
--                           or, while reserved, only "~reserved" -> the client id it is kept for
-- KEYS[2]  fence counter    string: highest token issued in this slot (shared by every lock in it)
-- KEYS[3]  op record        string, keyed by the holder id, as in acquire.lua: "a" once a
--                           recorded send ran (ARGV[7]), "c" when cancelled, "r:<op id>" once
--                           released; kept ARGV[3] ms
-- KEYS[4]  queue            sorted set: client id -> server time (µs) of its first failed
--                           attempt since it was last served; same slot as the lock
-- ARGV[1]  holder id        unique per acquisition, never reused
-- ARGV[2]  lease in ms      positive integer
-- ARGV[3]  op record lifetime in ms
-- ARGV[4]  client id        the acquiring client's id (the part of ARGV[1] before ':')
-- ARGV[5]  "1": a waiter; on failure queue the client (ZADD NX); "0": try_acquire, no queueing
-- ARGV[6]  queue slack in ms: the queue expires this long after the lock's current lease ends
--          (every failed attempt sets it again), so entries of vanished clients cannot leak
-- ARGV[7]  "1": record this send, "0": the acquisition's only send so far (acquire.lua ARGV[4]
--          says when a record is needed and why a first send needs none)
-- ARGV[8]  label            optional, as acquire.lua ARGV[5]
--
-- Returns  {1, token, 1}    acquired: the lock was free, or reserved for this client (claimed);
--                           the hash now maps holder -> 1 with a new token, and the client's
--                           queue entry is gone
--          {1, token, n}    replay: this holder already holds the lock; nothing changes
--                           but the record
--          {0, pttl}        held by another holder, or reserved for another client; pttl is the
--                           remaining lease or reservation in ms (-1: no expiry, operator-made)
--          {-2}             cancelled, or a late duplicate of an acquisition whose hold ended;
--                           nothing done
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing modified
--          FENCELOCK_OVERFLOW   the next token would not be exact in a Lua double; nothing modified
--
-- A reservation is a hash without a holder field, so every owner-checked script (release,
-- reenter, extend, renew, cancel) answers "not held" for it, and acquire.lua (default mode)
-- sees a held lock. A claim deletes it and issues a fresh token exactly as a free lock would:
-- max(counter + 1, TIME). A free lock is taken by whoever comes (the queue orders handoffs at
-- release time only), and the winner removes its own queue entry. Every read or write that can
-- fail comes before the first write that cannot be undone.
local done = redis.call('GET', KEYS[3])
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'hash' then
  local count = redis.call('HGET', KEYS[1], ARGV[1])
  if count then
    if ARGV[7] == '1' then
      redis.call('SET', KEYS[3], 'a', 'PX', ARGV[3], 'NX')
    end
    return {1, tonumber(redis.call('HGET', KEYS[1], '~token')), tonumber(count)}
  end
end
if done then
  return {-2}
end

local function wrongtype(reply, what)
  if type(reply) == 'table' and reply.err then
    if string.sub(reply.err, 1, 9) == 'WRONGTYPE' then
      return redis.error_reply('FENCELOCK_WRONGTYPE ' .. what)
    end
    return reply
  end
  return nil
end

local claim = false
if kind == 'hash' then
  claim = redis.call('HGET', KEYS[1], '~reserved') == ARGV[4]
  if not claim then
    local pttl = redis.call('PTTL', KEYS[1])
    if ARGV[5] == '1' then
      local now = redis.call('TIME')
      local score = string.format('%.0f', tonumber(now[1]) * 1000000 + tonumber(now[2]))
      local failed = wrongtype(redis.pcall('ZADD', KEYS[4], 'NX', score, ARGV[4]),
        'queue key is not a fencelock sorted set')
      if failed then
        return failed
      end
      local left = pttl
      if left < 0 then
        left = 1000
      end
      redis.call('PEXPIRE', KEYS[4], left + tonumber(ARGV[6]))
    end
    return {0, pttl}
  end
elseif kind ~= 'none' then
  return redis.error_reply('FENCELOCK_WRONGTYPE lock key holds a ' .. kind .. ', not a fencelock hash')
end

local token, token_text = next_token(KEYS[2])
if not token then
  return token_text -- the error reply
end
local failed

if not claim then
  -- A claim's entry was taken off the queue by the release that reserved the lock. Otherwise
  -- the winner leaves the queue; a failure here (foreign data) comes before any other write.
  failed = wrongtype(redis.pcall('ZREM', KEYS[4], ARGV[4]), 'queue key is not a fencelock sorted set')
  if failed then
    return failed
  end
end
redis.call('SET', KEYS[2], token_text)
if claim then
  redis.call('DEL', KEYS[1])
end
if ARGV[8] then
  redis.call('HSET', KEYS[1], ARGV[1], 1, '~token', token_text, '~label', ARGV[8])
else
  redis.call('HSET', KEYS[1], ARGV[1], 1, '~token', token_text)
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if ARGV[7] == '1' then
  redis.call('SET', KEYS[3], 'a', 'PX', ARGV[3])
end
return {1, token, 1}
