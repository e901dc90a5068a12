-- lib/next_token.lua: the fencing token of a new hold, shared by the scripts that issue one
-- (acquire.lua, handoff.lua, and sem_acquire.lua and rw_acquire.lua for a free semaphore or
-- lock, through take_token(); acquire_fair.lua, acquire_all.lua, sem_acquire.lua,
-- sem_handoff.lua, rw_acquire.lua, rw_read_many.lua through next_token()).
-- The loader (src/protocol/scripts.rs) prepends it to each. It calls no other library:
-- acquire.lua runs it on every acquisition, and each function a script defines costs its every
-- call (lib/calls.lua); so it makes its WRONGTYPE refusal (refused() there), its clock floor
-- (micros() of lib/clock.lua) and the token's text ("%d", as int_text() there) in line.
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
-- error leaves nothing done: for a script that may still refuse or wait after it has the
-- token, or that issues several.
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

-- take_token(fence_key, clock) issues the token as next_token(fence_key, clock) does and writes
-- it to the counter in the same call, for a script that grants the hold right after it, with
-- no check left that can fail (acquire.lua, handoff.lua; sem_token()'s callers when the
-- semaphore is free): TIME (unless given), then one SET ... KEEPTTL GET that writes
-- the clock floor and answers the counter it replaced. Nearly always that counter is digits
-- below the floor, and the floor is the token, its text made from TIME's two fields (no number
-- is parsed). Otherwise (the counter at or past the clock, no integer, not a string) the
-- counter is put back as it was, value and expiry, and next_token() issues from the same clock
-- and refuses what it refuses, its token then written. Returns the token's decimal text, or nil
-- and an error reply (nothing left changed).
local function take_token(fence_key, clock)
  local now = clock or redis.call('TIME')
  local text = now[1] .. string.sub('00000', #now[2]) .. now[2]
  local counter = redis.pcall('SET', fence_key, text, 'KEEPTTL', 'GET')
  -- No counter, or digits only (an anchored match: cheaper than tonumber's strtod) and fewer of
  -- them or smaller at the same length: below the floor.
  if not counter or type(counter) == 'string' and (#counter < #text or #counter == #text and counter < text)
      and string.find(counter, '^%d+$') then
    return text
  end
  if type(counter) == 'string' then
    redis.call('SET', fence_key, counter, 'KEEPTTL')
  end
  local token, issued = next_token(fence_key, now)
  if token then
    redis.call('SET', fence_key, issued, 'KEEPTTL')
  end
  return token and issued, issued
end
