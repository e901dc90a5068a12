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
-- Tokens come from next_token() (lib/next_token.lua: one TIME for the set), holds are written
-- by lock_grant() of lib/acquire.lua, as acquire.lua writes them; the loader prepends
-- lib/clock.lua (int_text) and both to this file.
local n = #KEYS / 3
local label = ARGV[3 + n]
local tokens, held, seen, busy = {}, 0, false, nil
for i = 1, n do
  local lock = KEYS[3 * i - 2]
  local kind = redis.call('TYPE', lock)['ok']
  if kind ~= 'hash' and kind ~= 'none' then
    return redis.error_reply('FENCELOCK_WRONGTYPE lock key holds a ' .. kind .. ', not a fencelock hash')
  end
  if kind == 'hash' and redis.call('HGET', lock, ARGV[2 + i]) then
    held = held + 1
    tokens[i] = tonumber(redis.call('HGET', lock, '~token'))
  elseif kind == 'hash' then
    busy = busy or i
  end
  seen = redis.call('EXISTS', KEYS[3 * i]) == 1 or seen
end
if held == n then
  return {1, unpack(tokens)}
end
-- Some member ran before (op record 'a') or was cancelled ('c'): a late or partly undone copy.
if seen then
  return {-2}
end
if busy ~= nil then
  return {0, busy, redis.call('PTTL', KEYS[3 * busy - 2])}
end

-- Every token before any write: fence counters are read once each (members may share one:
-- theirs get consecutive tokens), all with one clock.
local clock = redis.call('TIME')
local last = {}
for i = 1, n do
  local fence, err = KEYS[3 * i - 1], nil
  tokens[i], err = next_token(fence, clock, last[fence])
  if not tokens[i] then
    return err
  end
  last[fence] = tokens[i]
end

-- Each counter is written once, with the last token it issued.
for i = 1, n do
  local fence = KEYS[3 * i - 1]
  if last[fence] then
    redis.call('SET', fence, int_text(last[fence]))
    last[fence] = nil
  end
  lock_grant(KEYS[3 * i - 2], ARGV[2 + i], int_text(tokens[i]), label, ARGV[1], KEYS[3 * i], ARGV[2])
end
return {1, unpack(tokens)}
