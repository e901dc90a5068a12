-- lib/fence_mark.lua: shared by fenced_read.lua and fenced_write.lua; the loader
-- (src/protocol/scripts.rs) prepends it to each of them, since Redis scripts cannot import.
--
-- A resource has two marks. The exclusive mark is the highest token that wrote to it or read
-- it with a claim (a holder alone in its critical section); the shared mark is the highest
-- token that read it with a shared read (readers of one read-write lock, who hold it
-- together). An exclusive operation is refused below either mark; a shared read only below the
-- exclusive one, so readers never refuse each other.
--
-- fence_mark(token_arg, mark_key, shared_key) parses the presented token and reads both
-- marks. Returns token, exclusive mark, shared mark (0 where a mark is missing); or nil, an
-- error reply (nothing has been modified).
-- read_mark(key, what): one GET under redis.pcall, so the type check rides on the read (as
-- hash_field() does) instead of costing a TYPE per mark on every fenced call.
local function read_mark(key, what)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' and raw.err then
    if string.sub(raw.err, 1, 9) == 'WRONGTYPE' then
      return nil, redis.error_reply('FENCELOCK_WRONGTYPE ' .. what .. ' is not a string')
    end
    return nil, raw
  end
  if not raw then
    return 0
  end
  local mark = tonumber(raw)
  if mark == nil then
    return nil, redis.error_reply('FENCELOCK_WRONGTYPE ' .. what .. ' does not hold an integer')
  end
  return mark
end

local function fence_mark(token_arg, mark_key, shared_key)
  local token = tonumber(token_arg)
  if not token or token < 1 or token >= 9007199254740992 or token % 1 ~= 0 then
    return nil, redis.error_reply('FENCELOCK_BADARG fencing token must be a positive integer below 2^53')
  end
  local mark, err = read_mark(mark_key, 'high-water mark')
  if not mark then
    return nil, err
  end
  local shared
  shared, err = read_mark(shared_key, 'shared mark')
  if not shared then
    return nil, err
  end
  return token, mark, shared
end
