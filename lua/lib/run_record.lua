-- lib/run_record.lua: the run record, shared by the job scripts (job_begin.lua, job_finish.lua,
-- job_read.lua) and the idempotency scripts (idem_begin.lua, idem_finish.lua, idem_read.lua);
-- the loader (src/protocol/scripts.rs) prepends it to each of them, after lib/calls.lua and
-- lib/clock.lua (whose refused() and now_ms() it uses), since Redis scripts cannot import.
--
-- A run record is a hash next to a lock that names the newest run begun under that lock: the
-- kind's own field first (a job's "tick", an idempotency key's "fingerprint"), then "runner"
-- -> the holder id that runs or ran it, "token" -> that runner's fencing token, "started" ->
-- server time of the begin (ms), "previous" -> the token of the run it took over (a takeover's
-- begin only, so that a re-sent begin answers as its first send did), and once the run ended
-- "finished" (it ran) or "failed" (it left the record to a retry) -> server time of that end
-- (ms). Every write replaces the whole
-- hash and sets its expiry to the retention the caller passes. Each script's header states its
-- own contract in full; these functions are how the scripts carry it out.
--
-- run_fields(key, recorded, ...) returns the fields every reply naming the record `key` carries,
-- in this order: runner, token (`recorded`, the record's "token" as read), started, finished or
-- 0, failed or 0; then the arguments after `recorded` as given. Reads only (HGET).
--
-- run_begin(run) is the begin of job_begin.lua and idem_begin.lua: the lock's holder records a
-- run as its own, unless the record says not to. `run` names: `lock` and `key` (the lock hash
-- and the record), `holder` and `token` (the caller's holder id and token, as the arguments give
-- them), `field` and `value` (the kind's own field and the caller's value of it), `retention`
-- (ms the record is kept after this write), `policy` (for a run whose runner's hold ended
-- before it finished: "run-again" takes it over, anything else gives it up), `what` (how
-- FENCELOCK_WRONGTYPE names the record), `record(key, code, recorded)` (the kind's reply naming
-- the record: lib/idem_record.lua, lib/tick_record.lua), and the kind's checks of an existing
-- record: `before(recorded)`, made before the tokens are compared, answers a reply or nil;
-- `after(recorded)`, made after, answers nil (the same run goes on), 'new' (the record is
-- another run's that this one replaces) or a reply.
-- In that order it answers: {-1} when the caller does not hold the lock with its token (a
-- record of its own run, never finished, is then marked failed: a re-sent begin that came
-- after its hold ended, whose caller runs nothing); a
-- fresh begin {1, 0, started} without a record; the kind's reply from `before`; for the token
-- the record names (a re-sent begin) {1, previous or 0, started} again, as its first send
-- answered (a takeover stays a takeover when its reply was lost); code -2 for a newer
-- token; what `after` says; code 2 for a finished run; a takeover {1, old token, started}
-- of a failed run (whatever the policy) or of a running one under "run-again"; code 3
-- otherwise. A begin deletes the record and writes the kind's field, runner, token and started
-- anew. Commands: HGET, HSET, DEL, PEXPIRE, TIME.
--
-- run_finish(run) is the finish of job_finish.lua and idem_finish.lua: records that a run ended,
-- fenced by its token. `run` names `key`, `holder`, `token`, `field`, `value`, `retention` and
-- `what` as run_begin's, `started` (the server time its begin recorded), `outcome` (the
-- caller's), `ends` (the field the end goes to, "finished" or "failed", for each outcome the
-- kind takes) and, optionally, `also` (the kind's further fields of a finished run, written
-- with the record's: a list of fields and values). Answers FENCELOCK_BADARG for an outcome not
-- in `ends` (nothing changed); {-2, token} when the record carries a newer token (nothing changed); {1,
-- at} with the time already in the end's field for this token (a re-sent finish; nothing
-- changed); else deletes the record, writes it again from `run` with the end's field = server
-- time `at`, and answers {1, at}. Commands: HGET, HSET, DEL, PEXPIRE, TIME.
--
-- run_read(lock, key, what, record) is the read of job_read.lua and idem_read.lua: {0,
-- lock_token, pttl} without a record, else what record(key, 1, recorded, lock_token, pttl)
-- returns (the kind's reply naming the record, as run_begin's);
-- lock_token is the lock hash's "~token" (0: the lock is free) and pttl the lock's PTTL.
-- Commands: HGET, PTTL.
--
-- Each returns an error reply (refused) when a key holds another type: the records and the lock
-- are read with HGET (the least-privilege ACL has no HGETALL), whose WRONGTYPE names `what`
-- (run_field: the field, false when missing; or nil and "FENCELOCK_WRONGTYPE <what> is not a
-- fencelock hash").
local function run_field(key, field, what)
  local value = redis.pcall('HGET', key, field)
  if type(value) == 'table' and value.err then
    return nil, refused(value, what .. ' is not a fencelock hash')
  end
  return value
end

local function run_fields(key, recorded, ...)
  return redis.call('HGET', key, 'runner'),
    tonumber(recorded),
    tonumber(redis.call('HGET', key, 'started')),
    tonumber(redis.call('HGET', key, 'finished') or '0'),
    tonumber(redis.call('HGET', key, 'failed') or '0'),
    ...
end

-- Writes the record anew from `run` (see run_begin) with the further fields and values given,
-- and sets its expiry.
local function run_write(run, ...)
  redis.call('DEL', run.key)
  redis.call('HSET', run.key, run.field, run.value, 'runner', run.holder, 'token', run.token, ...)
  redis.call('PEXPIRE', run.key, run.retention)
end

local function run_begin(run)
  local held, held_err = run_field(run.lock, run.holder, 'lock key')
  if held == nil then
    return held_err
  end
  if not held or redis.call('HGET', run.lock, '~token') ~= run.token then
    -- A begin re-sent after its hold ended (the first send's reply was lost) may find its own
    -- run recorded: the caller learns it does not hold and runs nothing, so the run is left to
    -- a retry (failed), not taken for a dead runner's, which a give-up policy would give up.
    local mine = run_field(run.key, 'token', run.what) == run.token
      and redis.call('HGET', run.key, 'runner') == run.holder
    if mine and not redis.call('HGET', run.key, 'finished')
      and not redis.call('HGET', run.key, 'failed') then
      redis.call('HSET', run.key, 'failed', now_ms())
    end
    return {-1}
  end
  local recorded, recorded_err = run_field(run.key, 'token', run.what)
  if recorded == nil then
    return recorded_err
  end

  local function begin(previous)
    local started = now_ms()
    if previous > 0 then
      run_write(run, 'started', started, 'previous', string.format('%d', previous))
    else
      run_write(run, 'started', started)
    end
    return {1, previous, started}
  end

  if not recorded then
    return begin(0)
  end
  local refused = run.before and run.before(recorded)
  if refused then
    return refused
  end
  local token = tonumber(run.token)
  if tonumber(recorded) == token then
    local previous = tonumber(redis.call('HGET', run.key, 'previous') or '0')
    return {1, previous, tonumber(redis.call('HGET', run.key, 'started'))}
  end
  if tonumber(recorded) > token then
    return run.record(run.key, -2, recorded)
  end
  local other = run.after and run.after(recorded)
  if other == 'new' then
    return begin(0)
  elseif other then
    return other
  end
  if redis.call('HGET', run.key, 'finished') then
    return run.record(run.key, 2, recorded)
  end
  if run.policy == 'run-again' or redis.call('HGET', run.key, 'failed') then
    return begin(tonumber(recorded))
  end
  return run.record(run.key, 3, recorded)
end

local function run_finish(run)
  local ended = run.ends[run.outcome]
  if not ended then
    return redis.error_reply('FENCELOCK_BADARG unknown outcome ' .. tostring(run.outcome) ..
      ' for the ' .. run.what)
  end
  local recorded, recorded_err = run_field(run.key, 'token', run.what)
  if recorded == nil then
    return recorded_err
  end
  local token = tonumber(run.token)
  if recorded and tonumber(recorded) > token then
    return {-2, tonumber(recorded)}
  end
  -- A re-sent finish: the end's field is already set for this token.
  local at = recorded and tonumber(recorded) == token and redis.call('HGET', run.key, ended)
  if at then
    return {1, tonumber(at)}
  end
  at = now_ms()
  local also = ended == 'finished' and run.also or {}
  run_write(run, 'started', run.started, ended, at, unpack(also))
  return {1, at}
end

local function run_read(lock, key, what, record)
  local lock_token, lock_err = run_field(lock, '~token', 'lock key')
  if lock_token == nil then
    return lock_err
  end
  local recorded, recorded_err = run_field(key, 'token', what)
  if recorded == nil then
    return recorded_err
  end
  lock_token = tonumber(lock_token or '0')
  local pttl = redis.call('PTTL', lock)
  if not recorded then
    return {0, lock_token, pttl}
  end
  return record(key, 1, recorded, lock_token, pttl)
end
