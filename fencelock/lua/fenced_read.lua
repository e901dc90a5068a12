-- fenced_read.lua: read a resource as the holder of `token`, and claim it for that token, so
-- that from now on no older token can write to it.
--
-- KEYS[1]  resource data
-- KEYS[2]  high-water mark
-- ARGV[1]  token            positive integer below 2^53
-- ARGV[2]  kind             "get" | "hget" | "lrange" | "claim"
-- ARGV[3]  field            for hget
--
-- Returns  {1, value}       token >= mark: the mark is now max(mark, token); value is the string
--                           (get), the field (hget), the list (lrange), or 0 (claim); a missing
--                           key or field reads as false (nil)
--          {0, latest}      token < mark: a newer holder has claimed the resource; nothing read
--
-- Errors   FENCELOCK_WRONGTYPE  a key holds a type this read cannot apply to; nothing modified
--          FENCELOCK_BADARG     the token is not a valid integer
--
-- Why reads claim: fencing rejects a stale write only once the storage has seen the newer
-- token. If the new holder read without its token, a paused old holder waking between that
-- read and the new holder's write could still write (its token is not older than any the
-- resource has seen), and the new holder's write, computed from the earlier read, would then
-- overwrite it: a lost update. Claiming on read closes that gap. No op record: raising the
-- mark to the same token again changes nothing.
--
-- Uses fence_mark() from lib/fence_mark.lua, which the loader prepends to this file.
local token, mark = fence_mark(ARGV[1], KEYS[2])
if not token then
  return mark
end
if token < mark then
  return {0, mark}
end

local kind = ARGV[2]
local data_kind = redis.call('TYPE', KEYS[1])['ok']
local value = 0
if kind == 'get' then
  if data_kind ~= 'none' and data_kind ~= 'string' then
    return redis.error_reply('FENCELOCK_WRONGTYPE resource holds a ' .. data_kind .. ', not a string')
  end
  value = redis.call('GET', KEYS[1])
elseif kind == 'hget' then
  if data_kind ~= 'none' and data_kind ~= 'hash' then
    return redis.error_reply('FENCELOCK_WRONGTYPE resource holds a ' .. data_kind .. ', not a hash')
  end
  value = redis.call('HGET', KEYS[1], ARGV[3])
elseif kind == 'lrange' then
  if data_kind ~= 'none' and data_kind ~= 'list' then
    return redis.error_reply('FENCELOCK_WRONGTYPE resource holds a ' .. data_kind .. ', not a list')
  end
  value = redis.call('LRANGE', KEYS[1], 0, -1)
elseif kind ~= 'claim' then
  return redis.error_reply('FENCELOCK_BADARG unknown read kind ' .. tostring(kind))
end

if token > mark then
  redis.call('SET', KEYS[2], ARGV[1])
end
return {1, value}
