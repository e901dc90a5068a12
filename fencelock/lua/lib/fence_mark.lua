-- lib/fence_mark.lua: shared by fenced_read.lua and fenced_write.lua; the loader
-- (src/protocol/scripts.rs) prepends it to each of them, since Redis scripts cannot import.
--
-- fence_mark(token_arg, mark_key) parses the presented token and reads the resource's
-- high-water mark. Returns token, mark; or nil, an error reply (nothing has been modified).
local function fence_mark(token_arg, mark_key)
  local token = tonumber(token_arg)
  if not token or token < 1 or token >= 9007199254740992 or token % 1 ~= 0 then
    return nil, redis.error_reply('FENCELOCK_BADARG fencing token must be a positive integer below 2^53')
  end
  local mark = 0
  local mark_kind = redis.call('TYPE', mark_key)['ok']
  if mark_kind == 'string' then
    mark = tonumber(redis.call('GET', mark_key))
    if mark == nil then
      return nil, redis.error_reply('FENCELOCK_WRONGTYPE high-water mark does not hold an integer')
    end
  elseif mark_kind ~= 'none' then
    return nil, redis.error_reply('FENCELOCK_WRONGTYPE high-water mark holds a ' .. mark_kind)
  end
  return token, mark
end

