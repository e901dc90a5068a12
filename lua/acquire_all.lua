-- acquire_all.lua: take every lock of a set for new holders, or none of them (multi-lock).
--
-- KEYS[3i-2]  lock hash of member i      (as acquire.lua KEYS[1])
-- KEYS[3i-1]  fence counter of member i  (as acquire.lua KEYS[2]; members in one slot bucket
--                                         share it, and get distinct increasing tokens)
-- KEYS[3i]    op record of member i      (as acquire.lua KEYS[3], keyed by its holder id)
-- ARGV[1]     lease in ms (every member)
-- ARGV[2]     op record lifetime in ms
-- ARGV[2+i]   holder id of member i      (one per member, never reused)
-- ARGV[3+N]   label                      optional, as acquire.lua ARGV[5], for every member
--
-- Members come in the client's global order (sorted by lock key); the reply names the first
-- busy one in that order.
--
-- Returns  {1, token1, ..., tokenN}  acquired: every member's hash is {holder_i: 1, ~token}
--                                    with the lease; or a replay (every holder already holds
--                                    its member): the same tokens, nothing changes
--          {0, i, pttl}              member i (1-based) is held by another holder, pttl its
--                                    remaining lease in ms (-1: no expiry); nothing changed
--          {-2}                      the set was cancelled (cancel.lua on any member), or it ran
--                                    before and its hold ended since: nothing done
-- Errors   FENCELOCK_WRONGTYPE, FENCELOCK_OVERFLOW as acquire.lua; nothing modified
--
-- Each member is exactly what acquire.lua would have made for its holder id, so release.lua,
-- extend.lua, renew.lua, reenter.lua and cancel.lua (kind "acquire") work on members one by
-- one. Every read comes before the first write: an error or a busy member leaves nothing.
local n = #KEYS / 3
local label = ARGV[3 + n]
local tokens = {}
local held = 0
local seen = false
local busy = nil
for i = 1, n do
  local lock, op, holder = KEYS[3 * i - 2], KEYS[3 * i], ARGV[2 + i]
  local kind = redis.call('TYPE', lock)['ok']
  if kind == 'hash' then
    local count = redis.call('HGET', lock, holder)
    if count then
      held = held + 1
      tokens[i] = tonumber(redis.call('HGET', lock, '~token'))
    elseif busy == nil then
      busy = i
    end
  elseif kind ~= 'none' then
    return redis.error_reply('FENCELOCK_WRONGTYPE lock key holds a ' .. kind .. ', not a fencelock hash')
  end
  if redis.call('EXISTS', op) == 1 then
    seen = true
  end
end
if held == n then
  local reply = {1}
  for i = 1, n do
    reply[i + 1] = tokens[i]
  end
  return reply
end
-- Some member ran before (op record 'a') or was cancelled ('c'): a late or partly undone copy.
if seen then
  return {-2}
end
if busy ~= nil then
  return {0, busy, redis.call('PTTL', KEYS[3 * busy - 2])}
end

-- Fence counters, read once each (members may share one) before any write.
local last = {}
for i = 1, n do
  local fence = KEYS[3 * i - 1]
  if last[fence] == nil then
    local counter_kind = redis.call('TYPE', fence)['ok']
    if counter_kind == 'string' then
      last[fence] = tonumber(redis.call('GET', fence))
      if last[fence] == nil then
        return redis.error_reply('FENCELOCK_WRONGTYPE fence counter does not hold an integer')
      end
    elseif counter_kind == 'none' then
      last[fence] = 0
    else
      return redis.error_reply('FENCELOCK_WRONGTYPE fence counter holds a ' .. counter_kind)
    end
  end
end

local now = redis.call('TIME')
local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
for i = 1, n do
  local fence = KEYS[3 * i - 1]
  local token = math.max(last[fence] + 1, floor)
  if token >= 9007199254740992 then
    return redis.error_reply('FENCELOCK_OVERFLOW fence counter reached 2^53')
  end
  last[fence] = token
  tokens[i] = token
end

local reply = {1}
local written = {}
for i = 1, n do
  local lock, fence, op, holder = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], ARGV[2 + i]
  local token_text = string.format('%.0f', tokens[i])
  if not written[fence] then
    redis.call('SET', fence, string.format('%.0f', last[fence]))
    written[fence] = true
  end
  if label then
    redis.call('HSET', lock, holder, 1, '~token', token_text, '~label', label)
  else
    redis.call('HSET', lock, holder, 1, '~token', token_text)
  end
  redis.call('PEXPIRE', lock, ARGV[1])
  redis.call('SET', op, 'a', 'PX', ARGV[2])
  reply[i + 1] = tokens[i]
end
return reply
