-- acquire.lua: take a free lock for a new holder and issue its fencing token.
--
-- KEYS[1]  lock hash        fields: <holder id> -> re-entry count, "~token" -> fencing token,
--                           "~label" -> the acquisition's label (only when it was given one)
-- KEYS[2]  fence counter    string: highest token issued in this slot (shared by every lock in it)
-- KEYS[3]  op record        string, keyed by the holder id: "a" once this acquisition ran, "c"
--                           when it was cancelled (see cancel.lua); kept ARGV[3] ms
-- ARGV[1]  holder id        unique per acquisition, never reused
-- ARGV[2]  lease in ms      positive integer
-- ARGV[3]  op record lifetime in ms
-- ARGV[4]  label            optional: an operator's tag for the hold (a request or trace id),
--                           kept in the hash while the hold lasts; absent: no "~label" field
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
-- The token is max(counter + 1, server TIME in microseconds) (lib/next_token.lua says why).
-- Every read that can fail comes before the first write, so an error leaves nothing half-done.
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

local token, token_text = next_token(KEYS[2])
if not token then
  return token_text -- the error reply
end
redis.call('SET', KEYS[2], token_text)
if ARGV[4] then
  redis.call('HSET', KEYS[1], ARGV[1], 1, '~token', token_text, '~label', ARGV[4])
else
  redis.call('HSET', KEYS[1], ARGV[1], 1, '~token', token_text)
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[3], 'a', 'PX', ARGV[3])
return {1, token, 1}
