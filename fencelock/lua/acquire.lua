-- acquire.lua: take a free lock for a new holder and issue its fencing token.
--
-- KEYS[1]  lock hash        fields: <holder id> -> re-entry count, "~token" -> fencing token
-- KEYS[2]  fence counter    string: highest token issued in this slot (shared by every lock in it)
-- KEYS[3]  op record        string, keyed by the holder id: "a" once this acquisition ran, "c"
--                           when it was cancelled (see cancel.lua); kept ARGV[3] ms
-- ARGV[1]  holder id        unique per acquisition, never reused
-- ARGV[2]  lease in ms      positive integer
-- ARGV[3]  op record lifetime in ms
--
-- Returns  {1, token, 1}    acquired: the hash now maps holder -> 1 and expires after the lease
--          {1, token, n}    replay: this holder already holds the lock (the same request ran
--                           before and its reply was lost); nothing changes
--          {0, pttl}        held by another holder; pttl is its remaining lease in ms
--                           (-1 when the key has no expiry, which only an operator can cause)
--          {-2}             this acquisition was cancelled (cancel.lua), or it ran before and its
--                           hold has ended since (released or expired): a late duplicate of the
--                           request; nothing done
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing modified
--          FENCELOCK_OVERFLOW   the next token would not be exact in a Lua double; nothing modified
--
-- The token is max(counter + 1, server TIME in microseconds): the counter makes tokens strictly
-- increasing while Redis keeps its data, the clock floor keeps them increasing when the counter
-- was lost (restart without persistence, failover to a replica that missed the last write,
-- someone deleting the counter), as long as the server clock did not step back further than the
-- time that passed. Every read that can fail comes before the first write, so an error leaves
-- nothing half-done.
local done = redis.call('GET', KEYS[3])
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'hash' then
  local count = redis.call('HGET', KEYS[1], ARGV[1])
  if count then
    return {1, tonumber(redis.call('HGET', KEYS[1], '~token')), tonumber(count)}
  end
end
if done then
  return {-2}
end
if kind == 'hash' then
  return {0, redis.call('PTTL', KEYS[1])}
elseif kind ~= 'none' then
  return redis.error_reply('FENCELOCK_WRONGTYPE lock key holds a ' .. kind .. ', not a fencelock hash')
end

-- One read checks the counter's type too: GET of a non-string fails (WRONGTYPE), caught here
-- before anything is written, instead of a TYPE call before the GET. Any other error (an ACL
-- refusal) is returned as it is.
local counter = redis.pcall('GET', KEYS[2])
if type(counter) == 'table' and counter.err then
  if string.sub(counter.err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('FENCELOCK_WRONGTYPE fence counter is not a string')
  end
  return counter
end
local last = 0
if counter then
  last = tonumber(counter)
  if last == nil then
    return redis.error_reply('FENCELOCK_WRONGTYPE fence counter does not hold an integer')
  end
end

local now = redis.call('TIME')
local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
local token = math.max(last + 1, floor)
if token >= 9007199254740992 then
  return redis.error_reply('FENCELOCK_OVERFLOW fence counter reached 2^53')
end

local token_text = string.format('%.0f', token)
redis.call('SET', KEYS[2], token_text)
redis.call('HSET', KEYS[1], ARGV[1], 1, '~token', token_text)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[3], 'a', 'PX', ARGV[3])
return {1, token, 1}
