-- lib/hash_field.lua: shared by the job scripts (job_begin.lua, job_finish.lua, job_read.lua)
-- and the idempotency scripts (idem_begin.lua, idem_finish.lua, idem_read.lua);
-- the loader (src/protocol/scripts.rs) prepends it to each of them, before lib/run_record.lua,
-- which uses it too, since Redis scripts cannot import.
--
-- hash_field(key, field, what) reads one field of a hash this protocol writes (HGET: the
-- least-privilege ACL has no HGETALL). Returns the value (false when the key or field is
-- missing); or nil, an error reply: FENCELOCK_WRONGTYPE naming `what` when the key holds
-- another type, or the server's own error (an ACL refusal) as it is. Reads only.
local function hash_field(key, field, what)
  local value = redis.pcall('HGET', key, field)
  if type(value) == 'table' and value.err then
    if string.sub(value.err, 1, 9) == 'WRONGTYPE' then
      return nil, redis.error_reply('FENCELOCK_WRONGTYPE ' .. what .. ' is not a fencelock hash')
    end
    return nil, value
  end
  return value
end
