-- lib/next_token.lua: the fencing token of a new hold, shared by the scripts that issue one
-- from a single counter (acquire.lua, acquire_fair.lua, sem_acquire.lua, rw_acquire.lua; the
-- multi-lock's acquire_all.lua reads several counters and does the same per counter). The
-- loader (src/protocol/scripts.rs) prepends it to each.
--
-- next_token(fence_key, clock) reads the slot's fence counter and returns the next token,
-- max(counter + 1, server TIME in microseconds), as a number and as the decimal text to write
-- back; or nil and an error reply. `clock`, optional: the reply of a TIME the script already
-- made (one call less); without it, TIME is called here. It writes nothing: the caller writes the text to the counter
-- together with its hold, after its own checks, so an error leaves nothing done.
--
-- The counter makes tokens strictly increasing while Redis keeps its data; the clock floor
-- keeps them increasing when the counter was lost (restart without persistence, failover to a
-- replica that missed the last write, someone deleting the counter), as long as the server
-- clock did not step back further than the time that passed. One GET reads the counter and
-- checks its type (a non-string fails with WRONGTYPE, caught here); any other error (an ACL
-- refusal) is returned as it is.
local function next_token(fence_key, clock)
  local counter = redis.pcall('GET', fence_key)
  if type(counter) == 'table' and counter.err then
    if string.sub(counter.err, 1, 9) == 'WRONGTYPE' then
      return nil, redis.error_reply('FENCELOCK_WRONGTYPE fence counter is not a string')
    end
    return nil, counter
  end
  local last = 0
  if counter then
    last = tonumber(counter)
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
  return token, string.format('%.0f', token)
end
