-- acquire.lua: take a free lock for a new holder and issue its fencing token.
--
-- KEYS[1]  lock hash        fields: <holder id> -> re-entry count, "~token" -> fencing token,
--                           "~label" -> the acquisition's label (only when it was given one)
-- KEYS[2]  fence counter    string: highest token issued in this slot (shared by every lock in it)
-- KEYS[3]  op record        string, keyed by the holder id: "a" once a recorded send of this
--                           acquisition ran (ARGV[4]), "c" when it was cancelled (see cancel.lua),
--                           "r:<op id>" once its hold was released (release.lua); kept ARGV[3] ms
-- ARGV[1]  holder id        unique per acquisition, never reused
-- ARGV[2]  lease in ms      positive integer
-- ARGV[3]  op record lifetime in ms
-- ARGV[4]  "1": record this send: an earlier send of the acquisition may still arrive (its
--          outcome was unknown), so an acquisition or replay here leaves "a" in KEYS[3] for that
--          copy to find; "0": the acquisition's only send so far, nothing recorded (below)
-- ARGV[5]  label            optional: an operator's tag for the hold (a request or trace id),
--                           kept in the hash while the hold lasts; absent: no "~label" field
--
-- Returns  {1, token, 1}    acquired: the hash now maps holder -> 1 and expires after the lease
--          {1, token, n}    replay: this holder already holds the lock (the same request ran
--                           before and its reply was lost); nothing changes but the record
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
--
-- Why a first send records nothing: a copy of this request can only arrive after the hold
-- ended if the client sent it more than once, and every send after the first is a recorded
-- one. While the hold lasts, the holder in the hash makes any copy a replay; once a release
-- ended it, its mark "r:<op id>" is the record; a cancel leaves "c". What is left is a send
-- whose reply was lost and whose hold then expired unseen: a recorded re-send takes the lock
-- anew, with a greater token, which is right, since nobody ever acted under the first one.
local done = redis.call('GET', KEYS[3])
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'hash' then
  local count = redis.call('HGET', KEYS[1], ARGV[1])
  if count then
    if ARGV[4] == '1' then
      redis.call('SET', KEYS[3], 'a', 'PX', ARGV[3], 'NX')
    end
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
if ARGV[5] then
  redis.call('HSET', KEYS[1], ARGV[1], 1, '~token', token_text, '~label', ARGV[5])
else
  redis.call('HSET', KEYS[1], ARGV[1], 1, '~token', token_text)
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if ARGV[4] == '1' then
  redis.call('SET', KEYS[3], 'a', 'PX', ARGV[3])
end
return {1, token, 1}
