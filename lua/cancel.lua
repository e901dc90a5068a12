-- cancel.lua: undo exactly one acquire or re-entry whose caller gave up on it (cancelled
-- future, ambiguous error), whether or not that operation has run yet.
--
-- KEYS[1]  lock hash
-- KEYS[2]  op record of the operation being undone
-- ARGV[1]  holder id
-- ARGV[2]  op record lifetime in ms
-- ARGV[3]  "acquire" or "reenter": which operation KEYS[2] belongs to
-- ARGV[4]  pub/sub mode: "sharded" publishes a release with SPUBLISH, else PUBLISH (release.lua)
--
-- Returns  {1, n}           the operation had run and was undone; n entries remain
--          {0}              the operation had not run (or was already undone); it never will
--
-- The op record is set to "c" first, so if the undone request is still on its way (a re-send,
-- a slow network) it finds "c" when it arrives and does nothing. The loader prepends
-- lib/calls.lua (publish) to this file.
local done = redis.call('GET', KEYS[2])
if done == 'c' then
  return {0}
end
redis.call('SET', KEYS[2], 'c', 'PX', ARGV[2])

if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
  return {0}
end
local count = redis.call('HGET', KEYS[1], ARGV[1])
if not count then
  return {0}
end
if ARGV[3] == 'reenter' and not done then
  return {0}
end

local remaining = 0
if ARGV[3] == 'reenter' then
  remaining = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
end
if remaining <= 0 then
  remaining = 0
  redis.call('DEL', KEYS[1])
  publish(ARGV[4], KEYS[1], 'released')
end
return {1, remaining}
