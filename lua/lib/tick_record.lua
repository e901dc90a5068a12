-- lib/tick_record.lua: the reply naming a job's tick record, shared by job_begin.lua and
-- job_read.lua; the loader (src/protocol/scripts.rs) prepends it to both, after lib/calls.lua,
-- lib/clock.lua and lib/run_record.lua (whose run_fields() it uses).
--
-- tick_record(key, code, recorded, ...) returns {code, tick, runner, token (`recorded`, the
-- record's "token" as read), started, finished or 0, failed or 0}, then the arguments after
-- `recorded` as given. Reads only (HGET).
local function tick_record(key, code, recorded, ...)
  return {code, tonumber(redis.call('HGET', key, 'tick')), run_fields(key, recorded, ...)}
end
