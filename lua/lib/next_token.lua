-- lib/next_token.lua: the fencing token of a new hold, shared by the scripts that issue one
-- (acquire.lua, acquire_fair.lua, handoff.lua, acquire_all.lua, sem_acquire.lua,
-- sem_handoff.lua, rw_acquire.lua, rw_read_many.lua). The loader (src/protocol/scripts.rs)
-- prepends it to each. It calls no other library: acquire.lua runs it on every acquisition,
-- and each function a script defines costs its every call (lib/calls.lua); so it makes its
-- WRONGTYPE refusal (refused() there), its clock floor (micros() of lib/clock.lua) and the
-- token's text ("%d", as int_text() there) in line.
--
-- next_token(fence_key, clock, last) reads the slot's fence counter and returns the next
-- token, max(counter + 1, server TIME in microseconds), as a number and as the decimal text to
-- write back; or nil and an error reply. One GET reads the counter and checks its type (a
-- non-string fails with WRONGTYPE, answered FENCELOCK_WRONGTYPE; a string that is no integer
-- too); any other error (an ACL refusal) is returned as it is. `clock`, optional: the reply
-- of a TIME the script already made (one call less); without it, TIME is called here.
-- `last`, optional: the token this script issued last from the same counter (acquire_all.lua,
-- one token per member), which stands for the counter, not read again. It writes nothing: the
-- caller writes the text to the counter together with its hold, after its own checks, so an
-- error leaves nothing done.
--
-- The counter makes tokens strictly increasing while Redis keeps its data; the clock floor
-- keeps them increasing when the counter was lost (restart without persistence, failover to a
-- replica that missed the last write, someone deleting the counter), as long as the server
-- clock did not step back further than the time that passed.
local function next_token(fence_key, clock, last)
  if not last then
    local counter = redis.pcall('GET', fence_key)
    if type(counter) == 'table' and counter.err then
      return nil, string.sub(counter.err, 1, 9) ~= 'WRONGTYPE' and counter
        or redis.error_reply('FENCELOCK_WRONGTYPE fence counter is not a string')
    end
    last = tonumber(counter or '0')
    if last == nil then
      return nil, redis.error_reply('FENCELOCK_WRONGTYPE fence counter does not hold an integer')
    end
  end
  local now = clock or redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local token = math.max(last + 1, floor)
  if token >= 9007199254740992 then
    return nil, redis.error_reply('FENCELOCK_OVERFLOW fence counter reached 2^53')
  end
  return token, string.format('%d', token)
end
