-- lib/idem_record.lua: the reply naming an idempotency key's record, shared by idem_begin.lua
-- and idem_read.lua; the loader (src/protocol/scripts.rs) prepends it to both, after
-- lib/calls.lua, lib/clock.lua and lib/run_record.lua (whose run_fields() it uses).
--
-- idem_record(key, code, recorded, ...) returns {code, RECORD, ...}: RECORD is runner, token
-- (`recorded`, the record's "token" as read), started, finished or 0, failed or 0, final (0 or
-- 1), result ("" unless finished), fingerprint; then the arguments after `recorded` as given.
-- Reads only (HGET).
local function idem_record(key, code, recorded, ...)
  local finished = redis.call('HGET', key, 'finished')
  return {
    code,
    run_fields(key, recorded,
      tonumber(redis.call('HGET', key, 'final') or '0'),
      finished and (redis.call('HGET', key, 'result') or '') or '',
      redis.call('HGET', key, 'fingerprint'),
      ...),
  }
end
