-- reenter.lua: the current holder enters the lock once more (nested critical section).
--
-- KEYS[1]  lock hash
-- KEYS[2]  op record        string: this operation's reply, kept for ARGV[2] ms so a re-sent
--                           request replays it instead of counting twice; "c" when cancelled
-- ARGV[1]  holder id
-- ARGV[2]  op record lifetime in ms
--
-- Returns  {1, token, n}    entered: the holder's count is now n; token is the holder's current
--                           token (re-entry never issues a new one); the lease is unchanged
--          {-1}             the holder does not hold the lock (expired, deleted, or taken over)
--          {-2}             this operation was cancelled before it ran; nothing done
-- Errors   FENCELOCK_WRONGTYPE  the lock key holds a value this protocol did not write
local done = redis.call('GET', KEYS[2])
if done == 'c' then
  return {-2}
elseif done then
  local token, count = string.match(done, '^(%d+):(%d+)$')
  return {1, tonumber(token), tonumber(count)}
end

-- One read is the type check and the owner check: HGET of a non-hash fails (WRONGTYPE),
-- answered by refused() (lib/calls.lua, prepended by the loader) before anything is written.
local entered = redis.pcall('HGET', KEYS[1], ARGV[1])
if type(entered) == 'table' and entered.err then
  return refused(entered, 'lock key is not a fencelock hash')
end
if not entered then
  return {-1}
end

local count = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
local token = redis.call('HGET', KEYS[1], '~token')
redis.call('SET', KEYS[2], token .. ':' .. count, 'PX', ARGV[2])
return {1, tonumber(token), count}
